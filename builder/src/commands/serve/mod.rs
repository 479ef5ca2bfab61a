//! `builder serve`: a local web view of the repository's runs, cards, proposals and
//! retros, in this binary, with no JavaScript build: HTML rendered on the server
//! (axum, askama templates compiled in), a vendored htmx for partial updates and one
//! CSS file, all served from the binary. Each page has a JSON twin (the same URL with
//! `Accept: application/json`) made of the types the command line's `--json` prints.
//! The page data comes from `shared::pages` (and the functions the commands call);
//! this module is only HTTP: one submodule per page, and here the guard every
//! request passes (Host check against DNS rebinding, the token, read-only unless
//! `--write`, same-origin POSTs with a CSRF token) and the headers every response
//! carries (`Content-Security-Policy: default-src 'self'`, so nothing a page holds can
//! pull from another origin). It listens on 127.0.0.1 unless `--bind` names another
//! address, which then needs `--token`.

mod assets;
mod cards;
mod compare;
mod proposals;
mod retro;
mod run;
mod runs;

use crate::command_error::{CommandError, Outcome};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use shared::history;
use shared::store::Store;
use std::collections::HashMap;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Serve a local web view of runs, cards, proposals, comparisons and the retro
///
/// Listens on 127.0.0.1 and prints the URL. Read-only unless started with --write;
/// every change is a POST from the page (same origin, CSRF token) and writes what the
/// matching command writes (`cards triage`, `approve`). Each page answers JSON with
/// `Accept: application/json`
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port to listen on (0: any free port; the URL printed says which)
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Open the page in the desktop's browser (xdg-open)
    #[arg(long)]
    pub open: bool,
    /// Allow changes from the page: card triage and approvals (read-only without it).
    /// Every request then needs a token: one is made for this start and printed with
    /// the URL, unless --token gives one
    #[arg(long)]
    pub write: bool,
    /// Listen on this address instead of 127.0.0.1 (anything but loopback needs --token)
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// Require this token on every request (header `Authorization: Bearer T`, or open
    /// the printed URL with `?token=T` once: a cookie keeps it); at least 16 characters
    #[arg(long, value_name = "T", env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
}

/// The port `builder serve` listens on unless told.
pub const DEFAULT_PORT: u16 = 8420;
/// The variable `--token` may come from (kept out of `ps`).
pub const TOKEN_ENV: &str = "BUILDER_SERVE_TOKEN";
/// The shortest token accepted.
const MIN_TOKEN: usize = 16;
/// The cookie a browser keeps the token in, followed by the server's port: a browser
/// sends a host's cookies to every port of it, so two servers must not overwrite each
/// other's.
const TOKEN_COOKIE: &str = "builder_token_";
/// What every response says about where its content may come from: this origin only,
/// never in a frame, no `<base>`, forms post only here.
pub const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";
/// The runtime's card directory, watched for changes.
const CARDS_DIR: &str = "cards";
/// Reviews kept in memory (each costs an eval run to make).
const REVIEW_CACHE: usize = 16;

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    limit_git_maps();
    let wt = super::open_repo(repo_path)?;
    let ip = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    if let Some(t) = &args.token {
        if t.chars().count() < MIN_TOKEN {
            return Err(CommandError::usage(format!(
                "--token is {} characters; it must have at least {MIN_TOKEN}",
                t.chars().count()
            ))
            .hint("for example: --token \"$(head -c 24 /dev/urandom | base64)\""));
        }
    }
    if !ip.is_loopback() && args.token.is_none() {
        return Err(CommandError::usage(format!(
            "--bind {ip} is not a loopback address: anyone who can reach it could read the history and, with --write, approve"
        ))
        .hint(format!("give a token too (--token T, or {TOKEN_ENV}), or leave --bind out to listen on 127.0.0.1")));
    }
    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, args.port)).map_err(|e| {
        CommandError::environment(format!("cannot listen on {ip}:{}: {e}", args.port))
            .hint("another program may hold the port: pick one with --port N (0 for any free port)")
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| CommandError::environment(format!("listening socket: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CommandError::environment(format!("listening socket: {e}")))?;
    // Changes act as the person running the server (their name on a triage, their
    // signing key on an approval): with --write, any other local user or program
    // that can reach the port could otherwise make them. A token they cannot know
    // is made for this start when none is given.
    let made = (args.write && args.token.is_none()).then(|| hex(&rand::random::<[u8; 24]>()));
    let token = args.token.clone().or_else(|| made.clone());
    let app = Arc::new(App::new(wt.root.clone(), &args, token.clone(), addr));
    let url = format!("http://{}/", host_port(addr));
    println!("listening on {url}");
    println!(
        "{}",
        if args.write {
            "changes allowed (--write): triage and approve from the pages"
        } else {
            "read-only: start with --write to triage or approve from the pages"
        }
    );
    let opened = match &made {
        Some(t) => {
            println!("every request needs this start's token: open {url}?token={t} (once: a cookie keeps it), or send Authorization: Bearer {t}");
            format!("{url}?token={t}")
        }
        None if token.is_some() => {
            println!("every request needs the token: open {url}?token=<T> once, or send Authorization: Bearer <T>");
            url.clone()
        }
        None => url.clone(),
    };
    let _ = std::io::stdout().flush();
    if args.open {
        open_browser(&opened, made.is_some().then_some(wt.root.as_path()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(3)
        .build()
        .map_err(|e| CommandError::environment(format!("starting the server: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| CommandError::environment(format!("listening socket: {e}")))?;
        axum::serve(listener, router(app))
            .with_graceful_shutdown(shutdown())
            .await
            .map_err(|e| CommandError::environment(format!("serving: {e}")))
    })?;
    Ok(Outcome::Ok)
}

/// libgit2 maps pack files in windows of up to 1 GiB and keeps up to 8 GiB mapped;
/// a long-lived server that reads a tree now and then would keep every page it
/// touched. Small windows and a small total keep its memory flat.
fn limit_git_maps() {
    // Before this process starts any thread (the server's runtime, its blocking pool
    // and the card watcher come after).
    if let Err(e) = kernel::libgit2::limit_pack_maps(1 << 20, 8 << 20) {
        tracing::warn!("cannot limit libgit2's pack maps: {e}");
    }
}

/// `a.b.c.d:port`, or `[v6]:port`.
fn host_port(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

/// Opens `url` in the desktop's browser. A URL holding a token made for this start
/// (`private`: the repository, whose state directory is the runtime's) is not put on
/// a command line, where any local user reads it in `/proc`: a page only its owner
/// can read, which sends the browser on to it, is opened instead (as Jupyter does).
fn open_browser(url: &str, private: Option<&Path>) {
    let target = match private.map(|root| redirect_page(root, url)) {
        Some(Ok(page)) => page.display().to_string(),
        Some(Err(e)) => {
            tracing::warn!(
                "--open: cannot write the page that opens the server ({e}); open the URL printed above yourself"
            );
            return;
        }
        None => url.to_string(),
    };
    match std::process::Command::new("xdg-open")
        .arg(&target)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(_) => {}
        Err(e) => tracing::warn!("--open: cannot run xdg-open ({e}); open the URL printed above yourself"),
    }
}

/// `.runtime/serve-open.html`, readable by its owner only, sending a browser to `url`.
fn redirect_page(root: &Path, url: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = root.join(shared::layout::STATE_DIR);
    std::fs::create_dir_all(&dir)?;
    let page = dir.join("serve-open.html");
    let _ = std::fs::remove_file(&page);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&page)?;
    let escaped = url.replace('&', "&amp;").replace('"', "&quot;");
    writeln!(
        f,
        "<!doctype html><meta http-equiv=\"refresh\" content=\"0;url={escaped}\"><a href=\"{escaped}\">open builder serve</a>"
    )?;
    Ok(page)
}

/// Ends the server on SIGINT or SIGTERM, letting requests in flight finish.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// The server's state.
pub struct App {
    pub root: PathBuf,
    pub write: bool,
    /// The CSRF token every form carries (random per server start).
    pub csrf: String,
    token: Option<String>,
    /// `Host` header values this server answers to.
    hosts: Vec<String>,
    /// The port it listens on.
    port: u16,
    /// Listening on every address (`--bind 0.0.0.0`, which needs a token): any
    /// `Host` with the server's port is answered, as the machine's names and
    /// addresses are not known here. A page whose name was rebound to this machine
    /// still lacks the token (the browser keeps the cookie for the name it was set on).
    any_host: Option<u16>,
    /// The index, opened on the first request and kept.
    index: Mutex<Option<Indexed>>,
    /// The work tree's card files may have changed since the index last looked
    /// (set by the watcher of `cards/`; always set when there is no watcher).
    cards_changed: Arc<AtomicBool>,
    /// Watches `cards/` (kept alive with the server; `None`: look on every request).
    watcher: Option<notify::RecommendedWatcher>,
    /// The runtime's state database, read for traces: opened once (a first open
    /// reads the whole write-ahead log) and kept; a read sees every commit since.
    trace: Mutex<Option<Store>>,
    /// HEAD when the index last looked at the card files.
    cards_head: Mutex<Option<String>>,
    /// Reviews made, by proposal name and the commits judged.
    reviews: Mutex<Vec<(String, Arc<shared::review_report::ReviewReport>)>>,
}

/// The open history index and the repository it indexes.
pub struct Indexed {
    pub repo: git2::Repository,
    pub store: Store,
    pub skipped: Vec<String>,
}

impl App {
    fn new(root: PathBuf, args: &Args, token: Option<String>, addr: SocketAddr) -> App {
        let port = addr.port();
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        let bound = host_port(addr);
        if !hosts.contains(&bound) {
            hosts.push(bound);
        }
        if port == 80 {
            // A browser leaves the scheme's own port out of `Host`.
            hosts.extend(["127.0.0.1", "localhost", "[::1]"].map(String::from));
        }
        let any_host = (addr.ip().is_unspecified() && token.is_some()).then_some(port);
        let csrf: [u8; 32] = rand::random();
        let cards_changed = Arc::new(AtomicBool::new(true));
        let watcher = watch_cards(&root.join(CARDS_DIR), cards_changed.clone());
        App {
            root,
            write: args.write,
            csrf: hex(&csrf),
            token,
            hosts,
            port,
            any_host,
            index: Mutex::new(None),
            cards_changed,
            watcher,
            cards_head: Mutex::new(None),
            trace: Mutex::new(None),
            reviews: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on the index brought up to date with HEAD (and, with `cards`, with
    /// the work tree's card files), as every command does before it reads.
    pub fn with_index<T>(
        &self,
        cards: bool,
        f: impl FnOnce(&mut Indexed) -> Result<T, PageError>,
    ) -> Result<T, PageError> {
        let mut guard = self
            .index
            .lock()
            .map_err(|_| PageError::internal("the index lock was poisoned by a failed request"))?;
        if guard.is_none() {
            let wt = shared::git::open_work_tree(&self.root).map_err(PageError::from_display)?;
            let store = history::open_store(&wt.root).map_err(PageError::from_display)?;
            *guard = Some(Indexed {
                repo: wt.repo,
                store,
                skipped: Vec::new(),
            });
        }
        let Some(ix) = guard.as_mut() else {
            return Err(PageError::internal("the index did not open"));
        };
        let stats = history::index(&ix.repo, &mut ix.store, &|_, _| {}).map_err(PageError::from_display)?;
        if cards {
            // A look at 20,000 card files costs more than a page may: look when a file
            // in cards/ changed (the watcher says) or HEAD moved, as a command would
            // find on its own look.
            let mut head = self
                .cards_head
                .lock()
                .map_err(|_| PageError::internal("the card lock was poisoned by a failed request"))?;
            let changed = self.cards_changed.swap(false, Ordering::SeqCst);
            if changed || *head != stats.head || self.watcher.is_none() {
                history::overlay_worktree_cards(&ix.repo, &mut ix.store, &mut ix.skipped)
                    .map_err(PageError::from_display)?;
                *head = stats.head;
            }
        }
        f(ix)
    }

    /// Runs `f` with the runtime's trace store, when this machine has one (tried
    /// again on each request until it opens: the first fire makes it).
    pub fn with_trace<T>(&self, f: impl FnOnce(Option<&Store>) -> Result<T, PageError>) -> Result<T, PageError> {
        let mut guard = self
            .trace
            .lock()
            .map_err(|_| PageError::internal("the trace lock was poisoned by a failed request"))?;
        if guard.is_none() {
            *guard = shared::pages::run::open_trace(&self.root);
        }
        f(guard.as_ref())
    }

    /// Whether this server answers to the `Host` (or `Origin` host) `host`.
    fn answers_to(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
            || self.any_host.is_some_and(|port| {
                host.rsplit_once(':')
                    .is_some_and(|(name, p)| !name.is_empty() && p.parse() == Ok(port))
            })
    }

    /// Whether `given` is this server's CSRF token (compared in constant time).
    pub fn csrf_ok(&self, given: &str) -> bool {
        same_secret(given, &self.csrf)
    }

    fn cached_review(&self, key: &str) -> Option<Arc<shared::review_report::ReviewReport>> {
        let reviews = self.reviews.lock().ok()?;
        reviews.iter().find(|(k, _)| k == key).map(|(_, r)| r.clone())
    }

    fn keep_review(&self, key: String, report: Arc<shared::review_report::ReviewReport>) {
        if let Ok(mut reviews) = self.reviews.lock() {
            reviews.retain(|(k, _)| *k != key);
            if reviews.len() >= REVIEW_CACHE {
                reviews.remove(0);
            }
            reviews.push((key, report));
        }
    }
}

/// A watcher that sets `changed` whenever something in `dir` is created, written,
/// renamed or removed; `None` (with a warning) where it cannot watch, and then every
/// card page looks at the files itself.
fn watch_cards(dir: &Path, changed: Arc<AtomicBool>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let on_event = move |e: notify::Result<notify::Event>| {
        let reads_only = matches!(&e, Ok(ev) if matches!(ev.kind, notify::EventKind::Access(_)));
        if !reads_only {
            changed.store(true, Ordering::SeqCst);
        }
    };
    let watched = notify::recommended_watcher(on_event)
        .and_then(|mut w| w.watch(dir, notify::RecursiveMode::Recursive).map(|()| w));
    match watched {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "cannot watch {} ({e}): every card page looks at the card files",
                dir.display()
            );
            None
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/runs", get(runs::page))
        .route("/runs/{id}", get(run::page))
        .route("/runs/{id}/timeline", get(run::timeline))
        .route("/runs/{id}/report", get(run::report))
        .route("/runs/{id}/spans/{span}/{which}", get(run::span))
        .route("/cards", get(cards::page))
        .route("/cards/triage", post(cards::triage))
        .route("/proposals", get(proposals::list))
        .route("/proposal", get(proposals::page))
        .route("/proposal/review", get(proposals::review))
        .route("/proposal/approve", post(proposals::approve))
        .route("/compare", get(compare::page))
        .route("/retro", get(retro::page))
        .route("/assets/htmx.min.js", get(assets::htmx))
        .route("/assets/style.css", get(assets::css))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

async fn not_found(wants: Wants) -> Response {
    PageError::not_found("no such page").render(wants)
}

/// What every request passes before its handler, and the headers every response
/// gets after it.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let wants = Wants::of(req.headers());
    let mut resp = match admit(&app, &req) {
        Ok(()) => next.run(req).await,
        Err(Refusal::Error(e)) => e.render(wants),
        Err(Refusal::Response(r)) => *r,
    };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={:.2}", started.elapsed().as_secs_f64() * 1e3)) {
        h.insert("server-timing", v);
    }
    resp
}

enum Refusal {
    Error(PageError),
    Response(Box<Response>),
}

/// Admits a request, or says why not.
fn admit(app: &App, req: &Request) -> Result<(), Refusal> {
    let headers = req.headers();
    // A page of another site whose name was rebound to 127.0.0.1 sends its own name.
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !app.answers_to(host) {
        return Err(Refusal::Error(PageError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!("this server answers to {}, not to Host `{host}`", app.hosts.join(", ")),
        )));
    }
    if let Some(token) = &app.token {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| {
                c.trim()
                    .strip_prefix(&format!("{TOKEN_COOKIE}{}=", app.port))
                    .map(str::to_string)
            })
            .next();
        let ok =
            bearer.is_some_and(|b| same_secret(b, token)) || cookie.as_deref().is_some_and(|c| same_secret(c, token));
        if !ok {
            let query: Vec<(String, String)> = req
                .uri()
                .query()
                .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default();
            let given = query.iter().find(|(k, _)| k == "token").map(|(_, v)| v.as_str());
            if req.method() == Method::GET && given.is_some_and(|g| same_secret(g, token)) {
                // Keep it in a cookie and drop it from the address bar.
                let rest: Vec<(String, String)> = query.into_iter().filter(|(k, _)| k != "token").collect();
                let mut to = req.uri().path().to_string();
                if !rest.is_empty() {
                    to.push('?');
                    to.push_str(
                        &url::form_urlencoded::Serializer::new(String::new())
                            .extend_pairs(rest)
                            .finish(),
                    );
                }
                let mut r = Redirect::to(&to).into_response();
                if let Ok(v) = HeaderValue::from_str(&format!(
                    "{TOKEN_COOKIE}{}={token}; HttpOnly; SameSite=Strict; Path=/",
                    app.port
                )) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
                return Err(Refusal::Response(Box::new(r)));
            }
            return Err(Refusal::Error(PageError::new(
                StatusCode::UNAUTHORIZED,
                "this server needs its token: send Authorization: Bearer <token>, or open a page with ?token=<token> once",
            )));
        }
    }
    match *req.method() {
        Method::GET | Method::HEAD => Ok(()),
        Method::POST => {
            if !app.write {
                return Err(Refusal::Error(PageError::new(
                    StatusCode::FORBIDDEN,
                    "read-only: this server was started without --write",
                )));
            }
            // A browser names the page a POST came from; it must be this very server
            // as the request reached it (on every address any name is answered, but a
            // page of another name is not ours).
            if let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
                let ours = origin
                    .strip_prefix("http://")
                    .is_some_and(|h| h.eq_ignore_ascii_case(host) && app.answers_to(h));
                if !ours {
                    return Err(Refusal::Error(PageError::new(
                        StatusCode::FORBIDDEN,
                        format!("a change must come from this server's own pages, not from {origin}"),
                    )));
                }
            }
            Ok(())
        }
        _ => Err(Refusal::Error(PageError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and POST",
        ))),
    }
}

/// What the client asked for: a page, or its JSON twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    Html,
    Json,
}

impl Wants {
    fn of(headers: &HeaderMap) -> Wants {
        let accept = headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()).unwrap_or("");
        if accept.contains("application/json") {
            Wants::Json
        } else {
            Wants::Html
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Wants {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Wants::of(&parts.headers))
    }
}

/// A request that could not be answered: its status and what to say.
#[derive(Debug)]
pub struct PageError {
    pub status: StatusCode,
    pub message: String,
    pub hint: Option<String>,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    error: &'a str,
    hint: Option<&'a str>,
}

impl PageError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> PageError {
        PageError {
            status,
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> PageError {
        self.hint = Some(hint.into());
        self
    }

    pub fn not_found(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn bad_request(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn internal(message: impl Into<String>) -> PageError {
        PageError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// An error of the library, classified as the command line classifies it: a
    /// usage error is the request's fault (400), a refusal is 403, the rest 500.
    pub fn from_display<E: Into<CommandError>>(e: E) -> PageError {
        let ce: CommandError = e.into();
        let status = match ce.kind {
            crate::command_error::Kind::Usage | crate::command_error::Kind::Config => StatusCode::BAD_REQUEST,
            crate::command_error::Kind::Refused => StatusCode::FORBIDDEN,
            crate::command_error::Kind::Environment | crate::command_error::Kind::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let hint = ce.hints().next();
        PageError {
            status,
            message: ce.message(),
            hint,
        }
    }

    pub fn render(self, wants: Wants) -> Response {
        match wants {
            Wants::Json => (
                self.status,
                axum::Json(ErrorJson {
                    error: &self.message,
                    hint: self.hint.as_deref(),
                }),
            )
                .into_response(),
            Wants::Html => {
                let page = ErrorPage {
                    l: Layout::plain(),
                    status: self.status.as_u16(),
                    message: printable(&self.message),
                    hint: self.hint.as_deref().map(printable),
                };
                match askama::Template::render(&page) {
                    Ok(html) => (self.status, axum::response::Html(html)).into_response(),
                    Err(_) => (self.status, self.message).into_response(),
                }
            }
        }
    }
}

/// What the layout of every page needs.
pub struct Layout {
    pub title: String,
    /// `read-only` or `writes allowed`.
    pub mode: &'static str,
    pub csrf: String,
    pub write: bool,
}

impl Layout {
    pub fn of(app: &App, title: impl Into<String>) -> Layout {
        Layout {
            title: printable(&title.into()),
            mode: if app.write { "writes allowed" } else { "read-only" },
            csrf: app.csrf.clone(),
            write: app.write,
        }
    }

    fn plain() -> Layout {
        Layout {
            title: "error".into(),
            mode: "",
            csrf: String::new(),
            write: false,
        }
    }
}

#[derive(askama::Template)]
#[template(path = "error.html")]
struct ErrorPage {
    l: Layout,
    status: u16,
    message: String,
    hint: Option<String>,
}

/// A one-line field of a record, safe for a terminal and (once askama escapes it)
/// for HTML: the function the command line prints record text through.
pub fn printable(s: &str) -> String {
    shared::text::printable(s).into_owned()
}

/// A multi-line field (a report, a diff, a payload): newlines and tabs kept.
pub fn printable_multiline(s: &str) -> String {
    shared::text::printable_multiline(s).into_owned()
}

/// The page, or its JSON twin, from the page's data.
pub fn respond<T: Serialize>(
    wants: Wants,
    data: Result<T, PageError>,
    html: impl FnOnce(T) -> Result<String, askama::Error>,
) -> Response {
    match data {
        Err(e) => e.render(wants),
        Ok(d) => match wants {
            Wants::Json => axum::Json(d).into_response(),
            Wants::Html => match html(d) {
                Ok(page) => axum::response::Html(page).into_response(),
                Err(e) => PageError::internal(format!("rendering the page: {e}")).render(wants),
            },
        },
    }
}

/// Runs page work off the async thread (SQLite and git block).
pub async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&App) -> Result<T, PageError> + Send + 'static,
) -> Result<T, PageError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || f(&app))
        .await
        .unwrap_or_else(|e| Err(PageError::internal(format!("the request's work failed: {e}"))))
}

/// Query parameters as one map (empty values dropped, as a form sends them).
pub fn non_empty(q: HashMap<String, String>) -> HashMap<String, String> {
    q.into_iter().filter(|(_, v)| !v.trim().is_empty()).collect()
}

/// Text sent as a plain-text page (a full payload or report).
pub fn plain_text(text: String) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        printable_multiline(&text),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abcdef0123456789", "abcdef0123456789"));
        assert!(!same_secret("abcdef0123456789", "abcdef012345678"));
        assert!(!same_secret("abcdef0123456789", "abcdef0123456780"));
        assert!(!same_secret("", "x"));
    }
}
