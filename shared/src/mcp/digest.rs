//! What an MCP server's entry starts, as a digest: `sha256:` over the program its
//! `argv[0]` resolves to, every later argument that names a file (the script an
//! interpreter runs: `python3 mcp/server.py`; [`file_arguments`]) with every file of
//! that script's directory and below (what it imports from beside it), and the argv
//! itself ([`command_digest`]). What the program imports from elsewhere on the
//! machine, and files named inside an argument (`--config=x.json`), are not pinned.
//! `builder mcp pin`
//! hashes the program every time; a fire checks it against the pin at every start, so
//! it goes through a stat cache ([`command_digest_cached`]) kept in the runtime's state
//! directory: a server run by an interpreter (`node`, `python3`) would otherwise hash
//! tens of megabytes before each fire's first model request. The cache follows git's
//! index: an entry counts only while the file has the same device, inode, size,
//! modification and change times as when it was hashed. And, as git's racy-entry rule,
//! only when both times were at least [`SETTLE_NS`] older than the moment hashing began:
//! file systems stamp times from a clock that ticks coarser than the wall clock (up to
//! a second), so a program rewritten in place within one tick of being hashed could
//! keep its stamp; such an entry is hashed again until it has settled. A replaced
//! program (a new inode) or one written in place (a new change time, which no user can
//! set back) misses. The cache lives where tools cannot reach (`.runtime/`, masked from
//! their sandbox).

use super::lock::LockError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cache file, under the runtime's state directory.
pub const CACHE_FILE: &str = "mcp-programs.json";

/// How much older than the hash a file's times must be for its entry to count: more
/// than the coarsest file-system timestamp tick (a second) and a little clock skew.
const SETTLE_NS: i128 = 2_000_000_000;

/// Where `program` resolves: a path (relative to the repository root) when it has a
/// `/`, else the first match on `path` (`PATH`'s syntax).
pub fn resolve_program(program: &str, root: &Path, path: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = root.join(program);
        return p.is_file().then_some(p);
    }
    // Only absolute entries: an empty or relative one names the working directory (the
    // repository's top, where anyone who can push may put a program of that name).
    path.split(':')
        .filter(|d| Path::new(d).is_absolute())
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// `sha256:` of the program `argv[0]` resolves to, of the files later arguments
/// name ([`file_arguments`]) and of the argv itself: what a server's pin says starts.
/// Hashes the files now.
pub fn command_digest(argv: &[String], root: &Path, path: &str) -> Result<String, LockError> {
    digest_with(argv, root, path, |file| {
        std::fs::read(file)
            .map(|bytes| Sha256::digest(&bytes).to_vec())
            .map_err(|source| LockError::Read {
                path: file.to_path_buf(),
                source,
            })
    })
}

/// [`command_digest`] through the stat cache in `state_dir` (see the module's
/// comment). A cache that cannot be read or written only costs the hash.
pub fn command_digest_cached(argv: &[String], root: &Path, path: &str, state_dir: &Path) -> Result<String, LockError> {
    let cache_file = state_dir.join(CACHE_FILE);
    let mut cache: BTreeMap<String, Cached> = std::fs::read(&cache_file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut changed = false;
    let digest = digest_with(argv, root, path, |file| {
        let (sha, new) = hash_cached(file, &mut cache)?;
        changed |= new;
        Ok(sha)
    });
    if changed {
        if let Err(e) = save(&cache_file, &cache) {
            tracing::debug!(file = %cache_file.display(), error = %e, "the MCP program digest cache was not written");
        }
    }
    digest
}

/// The SHA-256 of `file` from `cache` when its entry still describes it (see the
/// module's comment), else hashed now and, unless it changed while read, cached
/// (`true`: the cache gained an entry).
fn hash_cached(file: &Path, cache: &mut BTreeMap<String, Cached>) -> Result<(Vec<u8>, bool), LockError> {
    let key = file.to_string_lossy().into_owned();
    let read_error = |source| LockError::Read {
        path: file.to_path_buf(),
        source,
    };
    let before = std::fs::metadata(file).map_err(read_error)?;
    if let Some(hit) = cache.get(&key).filter(|c| c.stamp == Stamp::of(&before) && c.settled()) {
        if let Ok(sha) = hex::decode(&hit.sha256) {
            return Ok((sha, false));
        }
    }
    let began_ns = now_ns();
    let bytes = std::fs::read(file).map_err(read_error)?;
    let sha = Sha256::digest(&bytes).to_vec();
    let after = std::fs::metadata(file).map_err(read_error)?;
    if Stamp::of(&after) != Stamp::of(&before) {
        return Ok((sha, false));
    }
    cache.insert(
        key,
        Cached {
            stamp: Stamp::of(&after),
            hashed_from_ns: began_ns,
            sha256: hex::encode(&sha),
        },
    );
    Ok((sha, true))
}

/// The digest of `argv`, each file it starts or names hashed by `hash`.
fn digest_with(
    argv: &[String],
    root: &Path,
    path: &str,
    mut hash: impl FnMut(&Path) -> Result<Vec<u8>, LockError>,
) -> Result<String, LockError> {
    let files = file_arguments(argv, root);
    // The interpreter's script: the first argument naming a regular file, of the
    // repository (pinned) or of the machine (an installed server, as the interpreter).
    let script_at = argv
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, a)| may_name_a_file(a) && root.join(a).is_file())
        .map(|(i, _)| i);
    if let Some(why) = super::argv::unpinnable(argv, script_at) {
        return Err(LockError::Unpinnable {
            program: argv.first().cloned().unwrap_or_default(),
            why,
        });
    }
    let node = super::argv::family(argv.first().map_or("", String::as_str)) == Some(super::argv::Family::Node);
    let resolved = resolved(argv, root, path)?;
    let top = root.canonicalize().map_err(|source| LockError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    // A program of the repository (a script with a `#!` line) is pinned with its
    // directory, as a script an interpreter runs.
    let mut program = match resolved.canonicalize() {
        _ if in_a_virtualenv(&resolved) && (resolved.starts_with(root) || resolved.starts_with(&top)) => {
            // A virtualenv's interpreter of the repository (a link to the machine's
            // `python`, or a copy): what it loads from beside it (`site-packages`,
            // `.pth` files, `pyvenv.cfg`) is the repository's, which anyone who can push
            // changes and no pin covers (helper-113, helper-114).
            return Err(LockError::Unpinnable {
                program: argv.first().cloned().unwrap_or_default(),
                why: "a virtualenv's interpreter inside the repository: what it loads from beside it (site-packages, .pth files) is the repository's and unpinned; keep the server's environment outside the repository and name that interpreter".into(),
            });
        }
        Ok(inside) if inside.starts_with(&top) => {
            let node = node || runs_on_node(&inside);
            script_digest(&inside, &top, node, &mut hash)?
        }
        _ if resolved.starts_with(root) || resolved.starts_with(&top) => {
            // A link of the repository to a program of the machine: the machine's
            // program is what runs, but the link is the repository's to change.
            return Err(LockError::Unpinnable {
                program: argv.first().cloned().unwrap_or_default(),
                why: "a link of the repository to a program outside it: anyone who can push could point it elsewhere; name the program itself".into(),
            });
        }
        _ => hash(&resolved)?,
    };
    // A version manager's shim picks its interpreter by files in the working
    // directory, the repository's top: those chosen there are part of what starts;
    // so are the files by which a registry runner started there picks its package.
    let runner = runner_files(argv, root)?;
    for name in VERSION_FILES.iter().chain(runner) {
        let file = root.join(name);
        if std::fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()) {
            let mut h = Sha256::new();
            h.update(&program);
            h.update(name.as_bytes());
            h.update(hash(&file)?);
            program = h.finalize().to_vec();
        }
    }
    let files = files
        .into_iter()
        .map(|(i, file)| script_digest(&file, &top, node, &mut hash).map(|sha| (i, sha)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(combine(&program, &files, argv))
}

/// Whether `program` lies in a virtualenv: a `pyvenv.cfg` in its directory or the one
/// above (`.venv/bin/python` beside `.venv/pyvenv.cfg`).
fn in_a_virtualenv(program: &Path) -> bool {
    program
        .ancestors()
        .skip(1)
        .take(2)
        .any(|d| std::fs::symlink_metadata(d.join("pyvenv.cfg")).is_ok())
}

/// Whether the program `file` runs on Node (a `#!` line naming `node`, `nodejs`,
/// `bun`, `deno`, `tsx` or `ts-node`, directly or through `env`): then the
/// `node_modules` and `package.json` above it are its code too, as for a script `node`
/// is told to run (helper-113).
fn runs_on_node(file: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let line = head[..n].split(|b| *b == b'\n').next().unwrap_or_default();
    let Some(line) = line.strip_prefix(b"#!") else {
        return false;
    };
    String::from_utf8_lossy(line).split_whitespace().any(|word| {
        let name = word.rsplit('/').next().unwrap_or(word);
        matches!(name, "node" | "nodejs" | "bun" | "deno" | "tsx" | "ts-node")
    })
}

/// The name of the package a runner's `spec` names (`@scope/pkg@1.2.3` ->
/// `@scope/pkg`, `pkg==1.0` -> `pkg`).
fn package_name(spec: &str) -> &str {
    let (scope, rest) = match spec.strip_prefix('@') {
        Some(rest) => (1, rest),
        None => (0, spec),
    };
    let end = rest
        .find(['@', '=', '<', '>', '~', '!', '['])
        .map_or(spec.len(), |i| i + scope);
    &spec[..end]
}

/// The files at the repository's top by which the registry runner `argv` starts
/// (`npx`, `bunx`, `pnpx`, `uvx`, `pipx`) chooses what it runs and from where: its
/// configuration (a registry, a script shell, node options) and the project it finds
/// there. The package installed in the top's `node_modules` is refused for `npx` and
/// `bunx`: it runs instead of the registry's (helper-112: a pushed
/// `node_modules/<pkg>/index.js` ran under a trusted pin), and no pin covers it; other
/// packages there are left alone (a project's own dependencies, helper-114).
fn runner_files(argv: &[String], root: &Path) -> Result<&'static [&'static str], LockError> {
    const NODE: &[&str] = &[
        ".npmrc",
        "package.json",
        "package-lock.json",
        "npm-shrinkwrap.json",
        "bunfig.toml",
        ".yarnrc.yml",
        "pnpm-workspace.yaml",
    ];
    const PYTHON: &[&str] = &["uv.toml", "pyproject.toml", "pip.conf"];
    let program = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
    let (files, local) = match program {
        // `pnpm dlx` does not look in the project's tree.
        Some("pnpx") => (NODE, false),
        Some("npx" | "bunx") => (NODE, true),
        Some("uvx" | "pipx") => (PYTHON, false),
        _ => return Ok(&[]),
    };
    let name = crate::mcp::config::package_spec(argv)
        .ok()
        .flatten()
        .map(|spec| package_name(&spec).to_string());
    let installed = name.is_some_and(|n| std::fs::symlink_metadata(root.join("node_modules").join(n)).is_ok());
    if local && installed {
        return Err(LockError::Unpinnable {
            program: argv[0].clone(),
            why: "the repository's top has the package installed in `node_modules`, which the runner would start instead of the registry's, and no pin covers it: keep it out of the top's `node_modules` (or name the server's script with `node`)".into(),
        });
    }
    Ok(files)
}

/// The files at the repository's top by which version managers (pyenv, nodenv, nvm,
/// asdf, mise, rbenv) choose the interpreter their shim runs.
const VERSION_FILES: [&str; 9] = [
    ".python-version",
    ".node-version",
    ".nvmrc",
    ".tool-versions",
    ".mise.toml",
    "mise.toml",
    ".mise.local.toml",
    "mise.local.toml",
    ".ruby-version",
];

/// The most files a script's directory may hold to be pinned with it.
pub const PACKAGE_FILES_MAX: usize = 10_000;

/// The digest of the script `file` with every file of its directory and below: its
/// package. An interpreter imports from beside the script before anything else
/// (python's `sys.path[0]`, a `json.py` there shadows the standard library's; node's
/// relative `require`, and a bare one in every `node_modules` up to the top), so a file
/// anyone pushes there is the server's code as much as the script is. Each entry counts by its path in the directory, a link by its
/// target's text (not followed). A script at the repository's top is refused: the
/// whole repository would be its package.
fn script_digest(
    file: &Path,
    root: &Path,
    node: bool,
    hash: &mut impl FnMut(&Path) -> Result<Vec<u8>, LockError>,
) -> Result<Vec<u8>, LockError> {
    let dir = file.parent().unwrap_or(file);
    if root == dir {
        return Err(LockError::ScriptAtTop {
            script: file.to_path_buf(),
        });
    }
    let mut h = Sha256::new();
    h.update(hash(file)?);
    // What a link in the package may lead to: the package itself, and for Node every
    // `node_modules` above it, which the walk below pins (a workspace's links).
    let mut bounds = Bounds {
        top: root.to_path_buf(),
        within: vec![dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())],
    };
    if node {
        for above in dir.ancestors().skip(1).take_while(|a| a.starts_with(root)) {
            bounds.within.push(above.join("node_modules"));
        }
    }
    package_entries(&bounds, dir, dir, hash, &mut h, &mut 0)?;
    if !node {
        return Ok(h.finalize().to_vec());
    }
    // Node looks for a bare `require('x')` in every `node_modules` on the way up:
    // those between the script's directory and the repository's top are its code too.
    // Each found path counts by a tag and its place under the top.
    let named = |h: &mut Sha256, tag: u8, path: &Path| {
        h.update([tag]);
        h.update(path.strip_prefix(root).unwrap_or(path).as_os_str().as_encoded_bytes());
    };
    for above in dir.ancestors().skip(1).take_while(|a| a.starts_with(root)) {
        // Node reads the nearest `package.json` above for a bare name first (a package
        // naming itself, `exports`, `imports`, `type`).
        let manifest = above.join("package.json");
        if std::fs::symlink_metadata(&manifest).is_ok_and(|m| m.is_file()) {
            named(&mut h, 3, &manifest);
            h.update(hash(&manifest)?);
        }
        let modules = above.join("node_modules");
        if std::fs::symlink_metadata(&modules).is_ok() {
            named(&mut h, 2, &modules);
            if modules.is_dir() && !modules.is_symlink() {
                package_entries(&bounds, &modules, &modules, hash, &mut h, &mut 0)?;
            }
        }
    }
    Ok(h.finalize().to_vec())
}

/// Where the links of a pinned package may lead: `within` the trees the digest pins, or
/// out of the repository (`top`, canonical).
struct Bounds {
    top: std::path::PathBuf,
    within: Vec<std::path::PathBuf>,
}

/// A link in a pinned package that leads elsewhere in the repository (`common ->
/// ../../shared/common`): the interpreter imports through it, so the files behind it
/// are the server's code, which its text alone does not pin (helper-113). Refused,
/// also when nothing is there yet (read by its text: a push could put it there,
/// helper-114); a link into a tree the digest pins, or out of the repository (the
/// machine's), is not.
fn refuse_link_into(bounds: &Bounds, link: &Path) -> Result<(), LockError> {
    let top = &bounds.top;
    let target = match link.canonicalize() {
        Ok(t) => t,
        Err(_) => {
            let Ok(text) = std::fs::read_link(link) else {
                return Ok(());
            };
            let joined = link.parent().unwrap_or(link).join(text);
            match crate::layout::normalize(top, &joined.to_string_lossy()) {
                Some(rel) => top.join(rel),
                None => return Ok(()),
            }
        }
    };
    if target.starts_with(top) && !bounds.within.iter().any(|w| target.starts_with(w)) {
        return Err(LockError::Unpinnable {
            program: link.display().to_string(),
            why: format!(
                "a link in the server's directory to {} elsewhere in the repository: the files behind it would be the server's code, unpinned; copy them into the server's directory",
                target.strip_prefix(top).unwrap_or(&target).display()
            ),
        });
    }
    Ok(())
}

/// Adds every entry under `at` (in name order, below `dir`) to `h`; a link must stay
/// within `bounds`.
fn package_entries(
    bounds: &Bounds,
    dir: &Path,
    at: &Path,
    hash: &mut impl FnMut(&Path) -> Result<Vec<u8>, LockError>,
    h: &mut Sha256,
    count: &mut usize,
) -> Result<(), LockError> {
    let read_error = |source| LockError::Read {
        path: at.to_path_buf(),
        source,
    };
    let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(at)
        .map_err(read_error)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(read_error)?;
    names.sort();
    for name in names {
        *count += 1;
        if *count > PACKAGE_FILES_MAX {
            return Err(LockError::PackageTooLarge { dir: dir.to_path_buf() });
        }
        let path = at.join(&name);
        let rel = path.strip_prefix(dir).unwrap_or(&path);
        h.update([0]);
        h.update(rel.as_os_str().as_encoded_bytes());
        let meta = std::fs::symlink_metadata(&path).map_err(|source| LockError::Read {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            h.update(b"/");
            package_entries(bounds, dir, &path, hash, h, count)?;
        } else if meta.is_file() {
            h.update(b"f");
            h.update(hash(&path)?);
        } else if meta.file_type().is_symlink() {
            h.update(b"l");
            let target = std::fs::read_link(&path).map_err(|source| LockError::Read {
                path: path.clone(),
                source,
            })?;
            h.update(target.as_os_str().as_encoded_bytes());
            refuse_link_into(bounds, &path)?;
        } else {
            h.update(b"?");
        }
    }
    Ok(())
}

/// The arguments after `argv[0]` that name a regular file of the repository (relative
/// to its root, where servers start, or absolute under it), by position: the script
/// an interpreter runs (`python3 mcp/server.py`) is what the server is, and anyone
/// who can push can change it, so its bytes are pinned as the program's are; a change
/// (reviewed or not) is drift until the lock is pinned again, and the lock is
/// builder-owned. Files outside the repository are the machine's, as the program's
/// imports are. A flag (`-m`, `--stdio`) names none.
pub fn file_arguments(argv: &[String], root: &Path) -> Vec<(usize, PathBuf)> {
    // Judged where the file really is, however the argument spells it (`./`, `..`,
    // `//`, an absolute path, a link into the repository).
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    argv.iter()
        .enumerate()
        .skip(1)
        .filter(|(_, a)| may_name_a_file(a))
        .filter_map(|(i, a)| {
            let file = root.join(a).canonicalize().ok()?;
            (file.starts_with(&root) && file.is_file()).then_some((i, file))
        })
        .collect()
}

/// Whether an argument may name a file: not empty, not a flag (`-m`, `--stdio`).
fn may_name_a_file(arg: &str) -> bool {
    !arg.is_empty() && !arg.starts_with('-')
}

fn resolved(argv: &[String], root: &Path, path: &str) -> Result<PathBuf, LockError> {
    let program = argv.first().map(String::as_str).unwrap_or("");
    resolve_program(program, root, path).ok_or_else(|| LockError::NoProgram {
        program: program.to_string(),
    })
}

/// The digest of a program whose own hash is `program_sha256`, started with `argv`
/// whose file arguments (by position) hash to `files`.
fn combine(program_sha256: &[u8], files: &[(usize, Vec<u8>)], argv: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(program_sha256);
    for (i, a) in argv.iter().enumerate() {
        h.update([0]);
        h.update(a.as_bytes());
        if let Some((_, sha)) = files.iter().find(|(at, _)| *at == i) {
            h.update([1]);
            h.update(sha);
        }
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// What identifies a file's content without reading it, as git's index does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    stamp: Stamp,
    /// When hashing began (wall clock, ns since the epoch).
    hashed_from_ns: i128,
    sha256: String,
}

impl Cached {
    /// Whether the file had last changed well before it was hashed (by [`SETTLE_NS`]),
    /// so what was read is what the stamp describes.
    fn settled(&self) -> bool {
        let limit = self.hashed_from_ns - SETTLE_NS;
        self.stamp.mtime_ns < limit && self.stamp.ctime_ns < limit
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Written whole under a temporary name and renamed over the old cache.
fn save(file: &Path, cache: &BTreeMap<String, Cached>) -> std::io::Result<()> {
    let temp = file.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&temp, serde_json::to_vec(cache).map_err(std::io::Error::other)?)?;
    std::fs::rename(&temp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a cache that says `program` (as it is now, hashed long after it last
    /// changed) hashes to the SHA-256 of `claimed`.
    fn plant(state: &Path, program: &Path, claimed: &[u8], settled: bool) {
        let stamp = Stamp::of(&std::fs::metadata(program).unwrap());
        let after = if settled { 3 * SETTLE_NS } else { SETTLE_NS / 2 };
        let cache = BTreeMap::from([(
            program.to_string_lossy().into_owned(),
            Cached {
                stamp,
                hashed_from_ns: stamp.ctime_ns.max(stamp.mtime_ns) + after,
                sha256: hex::encode(Sha256::digest(claimed)),
            },
        )]);
        save(&state.join(CACHE_FILE), &cache).unwrap();
    }

    #[test]
    fn the_cache_answers_only_for_the_very_file_it_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, state) = (dir.path().join("repo"), dir.path().join("state"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let program = dir.path().join("server");
        std::fs::write(&program, b"#!/bin/sh\necho one\n").unwrap();
        let argv = vec![program.display().to_string(), "--stdio".to_string()];
        let fresh = command_digest(&argv, &root, "").unwrap();
        // With no cache the digest is the pin's, and it is cached.
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), fresh);
        assert!(state.join(CACHE_FILE).exists(), "the digest was cached");
        // A settled entry is answered from the cache without reading the file: a
        // planted entry claiming other bytes shows it was used.
        plant(&state, &program, b"other bytes", true);
        let claimed = combine(&Sha256::digest(b"other bytes"), &[], &argv);
        assert_ne!(claimed, fresh);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), claimed);
        // An entry hashed within the settle time of the file's last change is not.
        plant(&state, &program, b"other bytes", false);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), fresh);
        // Written in place, same size, its old modification time put back: the change
        // time still tells, so the planted entry no longer matches.
        plant(&state, &program, b"other bytes", true);
        let mtime = std::fs::metadata(&program).unwrap().modified().unwrap();
        std::fs::write(&program, b"#!/bin/sh\necho two\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&program)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let changed = command_digest(&argv, &root, "").unwrap();
        assert_ne!(changed, fresh);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), changed);
        // Replaced by another file (a new inode).
        plant(&state, &program, b"other bytes", true);
        let other_file = dir.path().join("server.new");
        std::fs::write(&other_file, b"#!/bin/sh\necho six\n").unwrap();
        std::fs::rename(&other_file, &program).unwrap();
        assert_eq!(
            command_digest_cached(&argv, &root, "", &state).unwrap(),
            command_digest(&argv, &root, "").unwrap()
        );
        // A cache someone damaged costs a hash, not a wrong answer.
        std::fs::write(state.join(CACHE_FILE), b"{not json").unwrap();
        assert_eq!(
            command_digest_cached(&argv, &root, "", &state).unwrap(),
            command_digest(&argv, &root, "").unwrap()
        );
    }

    /// `python3 mcp/server.py`: the script is the server, and a change to it (by
    /// anyone who can push, or in the work tree) is a change of what the pin names.
    #[test]
    fn the_script_an_interpreter_runs_is_pinned_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let (root, state) = (dir.path().join("repo"), dir.path().join("state"));
        std::fs::create_dir_all(root.join("mcp")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let interpreter = dir.path().join("python3");
        std::fs::write(&interpreter, b"an interpreter").unwrap();
        std::fs::write(root.join("mcp/server.py"), b"print('reviewed')\n").unwrap();
        let data = dir.path().join("outside.db");
        std::fs::write(&data, b"the machine's data").unwrap();
        std::os::unix::fs::symlink(&root, dir.path().join("link-to-repo")).unwrap();
        let through_link = dir.path().join("link-to-repo/mcp/server.py");
        let argv: Vec<String> = [
            interpreter.to_str().unwrap(),
            "-u",
            "mcp/server.py",
            "--stdio",
            data.to_str().unwrap(),
            "../outside.db",
            "mcp/../mcp//server.py",
            through_link.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        let script = root.join("mcp/server.py").canonicalize().unwrap();
        assert_eq!(
            file_arguments(&argv, &root),
            vec![(2, script.clone()), (6, script.clone()), (7, script)],
            "a flag names no file, nor does a path outside the repository; any spelling of the script does"
        );
        let pinned = command_digest(&argv, &root, "").unwrap();
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), pinned);
        std::fs::write(root.join("mcp/server.py"), b"print('TROJAN')\n").unwrap();
        let changed = command_digest(&argv, &root, "").unwrap();
        assert_ne!(changed, pinned, "the script's bytes are in the digest");
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), changed);
    }

    /// A registry runner started at the repository's top reads its configuration and
    /// project there: those files are in the digest (a changed `.npmrc` is drift), and a
    /// `node_modules` at the top, whose package would run instead of the registry's,
    /// is refused (helper-112).
    #[test]
    fn what_a_registry_runner_reads_at_the_top_is_pinned_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (root, bin) = (dir.path().join("repo"), dir.path().join("bin"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("npx"), b"a runner").unwrap();
        let path = bin.to_str().unwrap();
        let argv: Vec<String> = ["npx", "-y", "tickets-mcp@1.2.3"].map(String::from).to_vec();
        let plain = command_digest(&argv, &root, path).unwrap();
        std::fs::write(root.join(".npmrc"), b"registry=https://registry.example/\n").unwrap();
        let configured = command_digest(&argv, &root, path).unwrap();
        assert_ne!(configured, plain, "the top's .npmrc is in the digest");
        std::fs::create_dir_all(root.join("node_modules/left-pad")).unwrap();
        assert!(command_digest(&argv, &root, path).is_ok(), "the project's own packages");
        std::fs::create_dir_all(root.join("node_modules/tickets-mcp")).unwrap();
        let refused = command_digest(&argv, &root, path).unwrap_err().to_string();
        assert!(refused.contains("node_modules"), "{refused}");
        assert_eq!(package_name("@scope/pkg@1.2.3"), "@scope/pkg");
        assert_eq!(package_name("mcp-server-fetch==1.0"), "mcp-server-fetch");
    }

    /// Three ways code anyone can push ran under a trusted pin (helper-113): a
    /// virtualenv's `python` of the repository (a link to the machine's, loading the
    /// repository's `site-packages`) is refused; a program with a `#!` line naming node
    /// has the `node_modules` above it pinned; a link in a server's directory to other
    /// files of the repository is refused.
    #[test]
    fn code_a_push_could_change_beside_a_pinned_program_is_pinned_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir_all(root.join(".venv/bin")).unwrap();
        let machine = dir.path().join("python3");
        std::fs::write(&machine, b"the machine's interpreter").unwrap();
        std::os::unix::fs::symlink(&machine, root.join(".venv/bin/python")).unwrap();
        std::fs::write(root.join(".venv/pyvenv.cfg"), b"home = /usr/bin\n").unwrap();
        std::fs::create_dir_all(root.join("mcp/py")).unwrap();
        std::fs::write(root.join("mcp/py/server.py"), b"print('server')\n").unwrap();
        let venv: Vec<String> = [".venv/bin/python", "mcp/py/server.py"].map(String::from).to_vec();
        let refused = command_digest(&venv, &root, "").unwrap_err().to_string();
        assert!(refused.contains("virtualenv"), "{refused}");

        std::fs::create_dir_all(root.join("mcp/js/node_modules/helper")).unwrap();
        std::fs::write(
            root.join("mcp/js/server.js"),
            b"#!/usr/bin/env node\nrequire('helper')\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("mcp/node_modules/helper")).unwrap();
        std::fs::write(root.join("mcp/node_modules/helper/index.js"), b"reviewed").unwrap();
        let program: Vec<String> = ["mcp/js/server.js"].map(String::from).to_vec();
        let pinned = command_digest(&program, &root, "").unwrap();
        std::fs::write(root.join("mcp/node_modules/helper/index.js"), b"pushed").unwrap();
        assert_ne!(
            command_digest(&program, &root, "").unwrap(),
            pinned,
            "the node_modules above"
        );

        // A workspace's link into the `node_modules` above, which the walk pins, is fine.
        std::os::unix::fs::symlink("../../node_modules/helper", root.join("mcp/js/node_modules/linked")).unwrap();
        assert!(command_digest(&program, &root, "").is_ok());

        let python: Vec<String> = [machine.to_str().unwrap(), "mcp/py/server.py"]
            .map(String::from)
            .to_vec();
        // A link to what is not there yet reads by its text: a push could put it there.
        std::os::unix::fs::symlink("../../shared/later", root.join("mcp/py/later")).unwrap();
        let refused = command_digest(&python, &root, "").unwrap_err().to_string();
        assert!(refused.contains("shared/later"), "{refused}");
        std::fs::remove_file(root.join("mcp/py/later")).unwrap();
        std::fs::create_dir_all(root.join("shared/common")).unwrap();
        std::os::unix::fs::symlink("../../shared/common", root.join("mcp/py/common")).unwrap();
        let refused = command_digest(&python, &root, "").unwrap_err().to_string();
        assert!(refused.contains("shared/common"), "{refused}");

        // A virtualenv made with `--copies`: its interpreter is a file of the repository.
        std::fs::create_dir_all(root.join("venv2/bin")).unwrap();
        std::fs::write(root.join("venv2/pyvenv.cfg"), b"home = /usr/bin\n").unwrap();
        std::fs::write(root.join("venv2/bin/python"), b"a copied interpreter").unwrap();
        std::fs::create_dir_all(root.join("mcp/py2")).unwrap();
        std::fs::write(root.join("mcp/py2/server.py"), b"print('server')\n").unwrap();
        let copied: Vec<String> = ["venv2/bin/python", "mcp/py2/server.py"].map(String::from).to_vec();
        let refused = command_digest(&copied, &root, "").unwrap_err().to_string();
        assert!(refused.contains("virtualenv"), "{refused}");
    }

    /// What the script imports from beside it is its code too: a module shadowing the
    /// standard library's (`mcp/json.py`), a package below, a link's target. A script
    /// at the repository's top is refused, naming why.
    #[test]
    fn the_scripts_directory_is_pinned_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let (root, state) = (dir.path().join("repo"), dir.path().join("state"));
        std::fs::create_dir_all(root.join("mcp/lib")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        // Node, whose lookups on the way up are pinned too.
        let interpreter = dir.path().join("node");
        std::fs::write(&interpreter, b"an interpreter").unwrap();
        std::fs::write(root.join("mcp/server.py"), b"import json\n").unwrap();
        std::fs::write(root.join("mcp/lib/util.py"), b"X = 1\n").unwrap();
        std::fs::write(root.join("README.md"), b"not the server's\n").unwrap();
        let argv: Vec<String> = [interpreter.to_str().unwrap(), "mcp/server.py"]
            .map(String::from)
            .to_vec();
        let mut seen = vec![command_digest(&argv, &root, "").unwrap()];
        let mut differs = |what: &str| {
            let now = command_digest(&argv, &root, "").unwrap();
            assert_eq!(
                command_digest_cached(&argv, &root, "", &state).unwrap(),
                now,
                "{what}: cached"
            );
            assert!(!seen.contains(&now), "{what} is in the digest");
            seen.push(now);
        };
        std::fs::write(root.join("mcp/json.py"), b"steal()\n").unwrap();
        differs("a module beside the script");
        std::fs::write(root.join("mcp/lib/util.py"), b"X = steal()\n").unwrap();
        differs("a module in a package below");
        std::os::unix::fs::symlink("/etc/passwd", root.join("mcp/lib/link.py")).unwrap();
        differs("a link");
        std::fs::remove_file(root.join("mcp/lib/link.py")).unwrap();
        std::os::unix::fs::symlink("/etc/hosts", root.join("mcp/lib/link.py")).unwrap();
        differs("a link's target");
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        differs("a `node_modules` on the way up (node's bare `require`)");
        std::fs::write(root.join("node_modules/x/index.js"), b"steal()\n").unwrap();
        differs("a module in it");
        std::fs::write(
            root.join("package.json"),
            b"{\"name\": \"helper\", \"exports\": \"./x.js\"}",
        )
        .unwrap();
        differs("a `package.json` on the way up (node's self-reference)");
        std::fs::write(root.join(".python-version"), b"3.6.15\n").unwrap();
        differs("a version manager's file at the top");
        let unchanged = command_digest(&argv, &root, "").unwrap();
        std::fs::write(root.join("README.md"), b"changed elsewhere\n").unwrap();
        assert_eq!(
            command_digest(&argv, &root, "").unwrap(),
            unchanged,
            "outside the directory"
        );
        // Python never reads `node_modules`: a frontend's there is no part of its pin.
        let python = dir.path().join("python3");
        std::fs::write(&python, b"another interpreter").unwrap();
        let py: Vec<String> = [python.to_str().unwrap(), "mcp/server.py"].map(String::from).to_vec();
        let before = command_digest(&py, &root, "").unwrap();
        std::fs::write(root.join("node_modules/x/other.js"), b"frontend\n").unwrap();
        assert_eq!(command_digest(&py, &root, "").unwrap(), before);

        let module: Vec<String> = ["python3", "-W", "ignore", "-m", "srv"].map(String::from).to_vec();
        match command_digest(&module, &root, "/usr/bin:/bin") {
            Err(LockError::Unpinnable { why, .. }) => assert!(why.contains("names no script file"), "{why}"),
            other => panic!("{other:?}"),
        }
        let script_flag: Vec<String> = [interpreter.to_str().unwrap(), "mcp/server.py", "-c", "conf"]
            .map(String::from)
            .to_vec();
        command_digest(&script_flag, &root, "").expect("the script's own flags are its own");
        std::fs::write(root.join("server.py"), b"import json\n").unwrap();
        let top: Vec<String> = [interpreter.to_str().unwrap(), "server.py"].map(String::from).to_vec();
        let e = command_digest(&top, &root, "").unwrap_err();
        assert!(matches!(e, LockError::ScriptAtTop { .. }), "{e}");
        assert!(e.to_string().contains("directory of its own"), "{e}");
    }

    #[test]
    fn a_program_changed_as_it_was_hashed_is_not_trusted_from_the_cache() {
        let stamp = Stamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 100,
            ctime_ns: 200,
        };
        let at = |hashed_from_ns| Cached {
            stamp,
            hashed_from_ns,
            sha256: String::new(),
        };
        assert!(at(201 + SETTLE_NS).settled());
        assert!(!at(200 + SETTLE_NS).settled(), "changed within a tick of the hash");
        assert!(!at(150).settled(), "changed while it was hashed");
    }
}
