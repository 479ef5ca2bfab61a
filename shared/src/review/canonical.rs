//! Trees git itself refuses are never a builder tree. `git fsck` refuses a tree with
//! two entries of one name (`duplicateEntries`), entries out of git's order
//! (`treeNotSorted`), or a name git never writes (`.`, `..`, `.git` in any spelling,
//! an empty name, one holding `/`). An origin that does not check what it receives
//! (a bare repository's default) accepts such a tree from anyone who can push, and
//! then two programs read different bytes at one path: libgit2's lookup by name finds
//! one of two same-named entries, a checkout writes the other. The judge would approve
//! one file while the work tree, and every script reading it, held the other. So
//! every tree the approved tree is computed from is checked here first:
//! [`super::builder_tree_of`] refuses the commit, and the fire, the hook, `audit`
//! and the sync refuse with it.

use git2::{Oid, Repository};
use std::cell::RefCell;
use std::collections::HashSet;

/// Git's order of tree entries: by name, a directory's compared as if it ended in `/`.
pub(super) fn order_key(name: &[u8], mode: i32) -> Vec<u8> {
    let mut key = name.to_vec();
    if mode == 0o040000 {
        key.push(b'/');
    }
    key
}

/// Why git refuses the entry name `name`; `None` for a name git writes.
fn refused_name(name: &[u8]) -> Option<&'static str> {
    match name {
        b"" => Some("an empty name (git fsck: emptyName)"),
        b"." => Some("`.` (git fsck: hasDot)"),
        b".." => Some("`..` (git fsck: hasDotdot)"),
        _ if name.contains(&b'/') => Some("a name holding `/` (git fsck: fullPathname)"),
        _ if name.contains(&0) => Some("a name holding a NUL byte"),
        _ if crate::gitpath::is_dot_git(&String::from_utf8_lossy(name)) => Some("`.git` (git fsck: hasDotgit)"),
        _ => None,
    }
}

/// What makes `tree` (at `path`, `""` for the top) one git refuses, checking its own
/// entries only; `None` when git writes it so.
fn entries_refused(tree: &git2::Tree, path: &str) -> Option<String> {
    let mut names: HashSet<Vec<u8>> = HashSet::with_capacity(tree.len());
    let mut last: Option<Vec<u8>> = None;
    let at = |name: &[u8]| {
        let name = String::from_utf8_lossy(name);
        if path.is_empty() {
            name.escape_debug().to_string()
        } else {
            format!("{path}/{}", name.escape_debug())
        }
    };
    for e in tree.iter() {
        let name = e.name_bytes();
        if let Some(why) = refused_name(name) {
            return Some(format!("`{}`: {why}", at(name)));
        }
        if !names.insert(name.to_vec()) {
            return Some(format!("two entries named `{}` (git fsck: duplicateEntries)", at(name)));
        }
        let key = order_key(name, e.filemode());
        if last.as_ref().is_some_and(|l| *l >= key) {
            return Some(format!("`{}` out of git's order (git fsck: treeNotSorted)", at(name)));
        }
        last = Some(key);
    }
    None
}

/// The error for a tree git refuses: class `Tree`, code `Invalid`
/// ([`is_refused_tree`]).
fn refusal(path: &str, id: Oid, why: &str) -> git2::Error {
    let at = if path.is_empty() {
        "the top-level tree".to_string()
    } else {
        format!("the tree `{path}/`")
    };
    git2::Error::new(
        git2::ErrorCode::Invalid,
        git2::ErrorClass::Tree,
        format!(
            "{at} ({}) is one git itself refuses: {why}. Different programs read different files from such a tree, so no approval covers it; replace the commit that made it (`git fsck` names it) with one git writes",
            crate::text::short_oid(id)
        ),
    )
}

/// Whether `e` is this module's refusal of a tree.
pub fn is_refused_tree(e: &git2::Error) -> bool {
    e.class() == git2::ErrorClass::Tree && e.code() == git2::ErrorCode::Invalid
}

/// The deepest a tree may nest (git's own `core.maxTreeDepth` default): a deeper one,
/// pushed by anyone, would cost the walks below their stack otherwise.
const MAX_TREE_DEPTH: usize = 4096;

/// `name` below the directory `path` (`""` for the top).
fn joined(path: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    match path.is_empty() {
        true => name.into_owned(),
        false => format!("{path}/{name}"),
    }
}

/// Refuses the tree `id` at `path` when git would: its own entries and, with `deep`,
/// every tree below it. Trees found as git writes them are remembered for the thread
/// (a walk over records-only commits meets the same builder directories again).
pub fn check(repo: &Repository, id: Oid, path: &str, deep: bool) -> Result<(), git2::Error> {
    thread_local! {
        static PLAIN: RefCell<HashSet<(Oid, bool)>> = RefCell::new(HashSet::new());
    }
    let known =
        |id: Oid, deep: bool| PLAIN.with(|p| p.borrow().contains(&(id, deep)) || p.borrow().contains(&(id, true)));
    if known(id, deep) {
        return Ok(());
    }
    // A stack, not recursion: however deep a pushed tree nests, the walk stays in
    // bounds (and refuses past git's own limit).
    let mut stack = vec![(id, path.to_string(), 0usize)];
    while let Some((id, path, depth)) = stack.pop() {
        if depth > MAX_TREE_DEPTH {
            return Err(refusal(&path, id, "nested deeper than git's core.maxTreeDepth (4096)"));
        }
        let tree = repo.find_tree(id)?;
        if let Some(why) = entries_refused(&tree, &path) {
            return Err(refusal(&path, id, &why));
        }
        if deep {
            let below = tree.iter().filter(|e| e.filemode() == 0o040000 && !known(e.id(), true));
            stack.extend(below.map(|e| (e.id(), joined(&path, e.name_bytes()), depth + 1)));
        }
    }
    PLAIN.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() >= 16_384 {
            p.clear();
        }
        p.insert((id, deep));
    });
    Ok(())
}

/// Refuses the tree `new` (a whole commit's tree) when any tree in it that `old`
/// does not hold at the same path is one git refuses, or holds an entry naming an
/// object of another kind than its mode says: what a checkout from `old` to `new`
/// would write. The box's sync asks this before it moves, for every path, not only
/// the builder-owned ones: libgit2's checkout of a tree with a link and a directory
/// of one name writes the directory's files through the link, anywhere the box's
/// account can write (helper-95). Unchanged subtrees cost nothing; a walk with a
/// stack, as [`check`]'s.
pub fn check_changed(repo: &Repository, old: Option<Oid>, new: Oid, path: &str) -> Result<(), git2::Error> {
    let odb = repo.odb()?;
    let mut stack = vec![(old, new, path.to_string(), 0usize)];
    while let Some((old, new, path, depth)) = stack.pop() {
        if old == Some(new) {
            continue;
        }
        if depth > MAX_TREE_DEPTH {
            return Err(refusal(&path, new, "nested deeper than git's core.maxTreeDepth (4096)"));
        }
        check(repo, new, &path, false)?;
        let old_tree = old.map(|o| repo.find_tree(o)).transpose()?;
        let new_tree = repo.find_tree(new)?;
        for e in new_tree.iter().filter(|e| e.filemode() != 0o160000) {
            let was = old_tree.as_ref().and_then(|t| t.get_name_bytes(e.name_bytes()));
            if was
                .as_ref()
                .is_some_and(|o| o.id() == e.id() && o.filemode() == e.filemode())
            {
                continue;
            }
            let at = joined(&path, e.name_bytes());
            if let Some(why) = kind_refused(&odb, &e) {
                return Err(refusal(&path, new, &format!("`{}`: {why}", at.escape_debug())));
            }
            if e.filemode() == 0o040000 {
                let was = was.filter(|o| o.filemode() == 0o040000).map(|o| o.id());
                stack.push((was, e.id(), at, depth + 1));
            }
        }
    }
    Ok(())
}

/// Why the entry `e` names an object of another kind than its mode says (a file
/// entry naming a tree: git fsck reports the blob missing, and a checkout or a commit
/// over such a tree fails, helper-101), or one the repository lacks; `None` when it
/// names what its mode says. Submodules are not asked (their commit lives elsewhere).
fn kind_refused(odb: &git2::Odb, e: &git2::TreeEntry) -> Option<String> {
    let want = match e.filemode() {
        0o040000 => git2::ObjectType::Tree,
        _ => git2::ObjectType::Blob,
    };
    match odb.read_header(e.id()) {
        Ok((_, kind)) if kind == want => None,
        Ok((_, kind)) => Some(format!(
            "an entry of mode {:o} naming a {kind} (git fsck: a missing {want})",
            e.filemode()
        )),
        Err(_) => Some(format!(
            "names {}, which this repository lacks",
            crate::text::short_oid(e.id())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw tree of `entries` (mode, name, id) in the order given, as anyone can
    /// write with `git hash-object -t tree --literally`.
    fn raw_tree(repo: &Repository, entries: &[(&str, &[u8], Oid)]) -> Oid {
        let mut raw = Vec::new();
        for (mode, name, id) in entries {
            raw.extend_from_slice(mode.as_bytes());
            raw.push(b' ');
            raw.extend_from_slice(name);
            raw.push(0);
            raw.extend_from_slice(id.as_bytes());
        }
        repo.odb().unwrap().write(git2::ObjectType::Tree, &raw).unwrap()
    }

    #[test]
    fn trees_git_refuses_are_refused_at_any_depth_and_plain_ones_pass() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let a = repo.blob(b"approved\n").unwrap();
        let b = repo.blob(b"someone else's\n").unwrap();
        let plain = raw_tree(&repo, &[("100644", b"lib.sh", a), ("100755", b"run.sh", a)]);
        let dup = raw_tree(&repo, &[("100644", b"lib.sh", a), ("100644", b"lib.sh", b)]);
        // The attack's premise: libgit2 reads such a tree, and finds one entry by name.
        let read = repo.find_tree(dup).unwrap();
        assert_eq!(read.len(), 2, "libgit2 parses both entries");
        assert!(read.get_name("lib.sh").is_some());
        let cases: Vec<(Oid, &str)> = vec![
            (dup, "duplicateEntries"),
            (
                raw_tree(&repo, &[("100644", b"b", a), ("100644", b"a", a)]),
                "treeNotSorted",
            ),
            (
                raw_tree(&repo, &[("100644", b"x", a), ("40000", b"x", plain)]),
                "duplicateEntries",
            ),
            (raw_tree(&repo, &[("100644", b"..", a)]), "hasDotdot"),
            (raw_tree(&repo, &[("40000", b".GIT", plain)]), "hasDotgit"),
        ];
        for (bad, why) in cases {
            let e = check(&repo, bad, "tools", false).unwrap_err();
            assert!(is_refused_tree(&e) && e.message().contains(why), "{why}: {e}");
            // One level down, found only by the deep check.
            let top = raw_tree(&repo, &[("40000", b"tools", bad)]);
            check(&repo, top, "", false).unwrap();
            let e = check(&repo, top, "", true).unwrap_err();
            assert!(e.message().contains("`tools/`") && e.message().contains(why), "{e}");
        }
        check(&repo, plain, "tools", true).unwrap();
        let nested = raw_tree(
            &repo,
            &[("100644", b"a", a), ("40000", b"a", plain), ("100644", b"a0", a)],
        );
        assert!(check(&repo, nested, "", true).is_err(), "a blob and a tree of one name");
        // Git's order puts a directory `a` (as `a/`) after `a-b` and `a.x`.
        let ordered = raw_tree(
            &repo,
            &[("100644", b"a-b", a), ("100644", b"a.x", a), ("40000", b"a", plain)],
        );
        check(&repo, ordered, "", true).unwrap();
    }

    /// A sync's move judges every tree it would write, builder-owned or not, and only
    /// those: a duplicate a level down in a changed directory is refused, one in a
    /// subtree the box already holds unchanged is not looked at again.
    #[test]
    fn a_move_is_refused_when_any_tree_it_would_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let a = repo.blob(b"a\n").unwrap();
        let link = repo.blob(b"../.git/hooks").unwrap();
        let plain = raw_tree(&repo, &[("100644", b"x", a)]);
        let docs_link = raw_tree(&repo, &[("120000", b"h", link)]);
        let docs_dup = raw_tree(&repo, &[("120000", b"h", link), ("40000", b"h", plain)]);
        let top = |docs: Oid| raw_tree(&repo, &[("40000", b"docs", docs), ("40000", b"tools", plain)]);
        let (before, after) = (top(docs_link), top(docs_dup));
        let e = check_changed(&repo, Some(before), after, "").unwrap_err();
        assert!(is_refused_tree(&e) && e.message().contains("`docs/h`"), "{e}");
        assert!(
            check_changed(&repo, None, after, "").is_err(),
            "a first checkout checks everything"
        );
        check_changed(&repo, Some(before), top(plain), "").unwrap();
        check_changed(&repo, Some(after), after, "").unwrap();
        // A file entry naming a tree (helper-101), at the top and in a new directory.
        let wrong_kind = raw_tree(&repo, &[("100644", b"docs", plain), ("40000", b"tools", plain)]);
        let e = check_changed(&repo, Some(before), wrong_kind, "").unwrap_err();
        assert!(is_refused_tree(&e) && e.message().contains("`docs`"), "{e}");
        let new_dir = raw_tree(&repo, &[("100644", b"x", plain)]);
        let below = raw_tree(&repo, &[("40000", b"docs", new_dir), ("40000", b"tools", plain)]);
        let e = check_changed(&repo, Some(before), below, "").unwrap_err();
        assert!(is_refused_tree(&e) && e.message().contains("`docs/x`"), "{e}");
    }

    /// A tree nested past git's own limit is refused, by a walk that does not run out
    /// of stack however deep the pushed tree goes.
    #[test]
    fn a_tree_nested_past_gits_limit_is_refused_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut tree = raw_tree(&repo, &[("100644", b"leaf", repo.blob(b"x").unwrap())]);
        for _ in 0..MAX_TREE_DEPTH + 10 {
            tree = raw_tree(&repo, &[("40000", b"d", tree)]);
        }
        let e = check(&repo, tree, "", true).unwrap_err();
        assert!(is_refused_tree(&e) && e.message().contains("maxTreeDepth"), "{e}");
        let e = check_changed(&repo, None, tree, "").unwrap_err();
        assert!(is_refused_tree(&e) && e.message().contains("maxTreeDepth"), "{e}");
    }
}
