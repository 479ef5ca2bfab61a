//! Puts the commit the binaries are built from into their `--version`
//! (`BUILD_COMMIT`): the workspace's HEAD, or `unknown` where there is no git or no
//! repository (a source tarball). Rebuilt when HEAD or the branch it names moves;
//! uncommitted changes are not tracked (that would rebuild on every `git add`).

use std::path::Path;
use std::process::Command;

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&workspace)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_COMMIT={commit}");
    // HEAD names the branch; the branch's ref (loose or packed) names the commit.
    let git_dir = Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .current_dir(&workspace)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string());
    if let Some(dir) = git_dir.filter(|d| !d.is_empty()) {
        let dir = Path::new(&dir);
        for watched in ["HEAD", "packed-refs"] {
            println!("cargo:rerun-if-changed={}", dir.join(watched).display());
        }
        if let Ok(head) = std::fs::read_to_string(dir.join("HEAD")) {
            if let Some(branch) = head.trim().strip_prefix("ref: ") {
                println!("cargo:rerun-if-changed={}", dir.join(branch).display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
