//! The two files every page loads, compiled into the binary: the vendored htmx
//! (version and licence in `assets/README.md`) and the stylesheet.

use axum::http::header;
use axum::response::IntoResponse;

/// htmx 2.0.7 (`htmx.org` on npm, `dist/htmx.min.js`), Zero-Clause BSD.
pub const HTMX: &str = include_str!("assets/htmx.min.js");
const CSS: &str = include_str!("assets/style.css");

pub async fn htmx() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], HTMX)
}

pub async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version of [`HTMX`], as `assets/README.md` and `docs/serve.md` name it.
    const HTMX_VERSION: &str = "2.0.7";

    #[test]
    fn the_vendored_htmx_is_the_one_the_readme_names() {
        use sha2::Digest as _;
        let hash = hex::encode(sha2::Sha256::digest(HTMX.as_bytes()));
        let readme = include_str!("assets/README.md");
        assert!(
            readme.contains(&hash),
            "assets/README.md names another hash than {hash}"
        );
        assert!(readme.contains(HTMX_VERSION));
        assert!(
            HTMX.contains(&format!("version:\"{HTMX_VERSION}\"")),
            "htmx.min.js is not {HTMX_VERSION}"
        );
    }
}
