//! Puts the commit the binaries are built from into their `--version`
//! (`BUILD_COMMIT`): the workspace's HEAD, or `unknown` where there is no git or no
//! repository (a source tarball). Rebuilt when HEAD or the branch it names moves, also
//! when the branch lived only in `packed-refs` until its commit; uncommitted changes
//! are not tracked (that would rebuild on every `git add`).

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
    // HEAD names the branch; the branch's ref (loose, or in packed-refs) names the
    // commit. A linked worktree keeps its HEAD apart and its refs in the common
    // directory. Only paths that exist are named: cargo runs a build script again
    // on every build while a path it watches is missing (a repository with no
    // packed-refs yet would rebuild both binaries every time).
    let rev_parse = |arg: &str| {
        Command::new("git")
            .args(["rev-parse", arg])
            .current_dir(&workspace)
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let (Some(git_dir), Some(common)) = (rev_parse("--absolute-git-dir"), rev_parse("--git-common-dir")) {
        let git_dir = Path::new(&git_dir);
        let common = git_dir.join(common);
        let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
        if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD")) {
            if let Some(branch) = head.trim().strip_prefix("ref: ") {
                // A branch kept only in packed-refs gets a loose ref at its next
                // commit: the directory it will appear in is watched until then.
                let loose = common.join(branch);
                let first_existing = loose.ancestors().find(|p| p.exists()).map(Path::to_path_buf);
                watched.extend(first_existing);
            }
        }
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
