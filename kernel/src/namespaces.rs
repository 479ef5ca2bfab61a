//! Short-lived clones into fresh namespaces, for what cannot be had otherwise: a
//! descriptor of a user namespace with given id maps (for idmapped mounts), and
//! whether namespaces can be made at all. Each clone only makes async-signal-safe
//! calls and leaves, so these work in a process of any number of threads.

use crate::process::{clone_unchecked, exit_now, Cloned, Namespaces};
use std::io::{self, Read};
use std::os::fd::OwnedFd;

/// Whether a clone into fresh `namespaces` can be made here: one that exits at once.
pub fn probe(namespaces: Namespaces) -> io::Result<()> {
    // SAFETY: the clone only calls _exit(2), which is async-signal-safe.
    match unsafe { clone_unchecked(namespaces.flags()) }? {
        Cloned::Child => exit_now(0),
        Cloned::Parent(pid) => {
            let _ = crate::process::wait(pid);
            Ok(())
        }
    }
}

/// A descriptor of a new user namespace whose id maps are `uid_map` and `gid_map`
/// (the text of `/proc/<pid>/uid_map`): a clone holds the namespace, waiting on a
/// pipe, while the maps are written and its descriptor opened.
pub fn user_namespace(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    let (r, w) = io::pipe()?;
    // SAFETY: the clone only reads its pipe (read(2)) and calls _exit(2), both
    // async-signal-safe.
    let pid = match unsafe { clone_unchecked(libc::CLONE_NEWUSER) }? {
        Cloned::Child => {
            drop(w);
            let mut r = r;
            let _ = r.read(&mut [0u8; 1]);
            exit_now(0)
        }
        Cloned::Parent(pid) => pid,
    };
    drop(r);
    let opened = (|| {
        std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), gid_map)?;
        Ok(OwnedFd::from(std::fs::File::open(format!("/proc/{pid}/ns/user"))?))
    })();
    drop(w);
    let _ = crate::process::wait(pid);
    opened
}
