//! The seccomp filter of the tool worker (issue 10, item 2), built with `seccompiler`
//! (rust-vmm) rather than hand-assembled BPF. It refuses with `EPERM` what Landlock
//! and the namespaces do not cover: sockets other than `AF_UNIX` (unless settings grant
//! tools network, then TCP only: Landlock scopes the ports, and no `listen`), `ptrace`,
//! `process_vm_readv/writev`, `io_uring_*`, `mknod` of device nodes, the key ring,
//! `bpf`, `perf_event_open`, every mount and namespace call (set-up is over when the
//! filter is installed), `prlimit64` on another process, kernel modules, `kexec` and
//! `reboot`, `pidfd_getfd`, `MSG_FASTOPEN` (TCP Fast Open connects without the
//! `connect` Landlock checks), and the setuid and setgid bits in any mode a tool sets.
//! x32 syscalls are refused too. `clone3` and `openat2` answer `ENOSYS` (their flags and mode sit in memory a filter
//! cannot read), so libc falls back to `clone` and `openat`, which are checked. The list follows
//! Codex's Linux sandbox (`codex-rs/linux-sandbox`).

use kernel::seccomp::X32_SYSCALL_BIT;
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
    SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp filter cannot be built: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("seccomp filter cannot be installed: {0}")]
    Install(#[from] seccompiler::Error),
    #[error("seccomp is not available ({0})")]
    Unavailable(String),
}

/// Syscalls refused whatever their arguments.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_userfaultfd,
    libc::SYS_pidfd_getfd,
];

/// Calls that set a file's mode, and the index of their mode argument: none may set
/// the setuid or setgid bit. As root, tools write through idmapped mounts, so a file
/// `nobody` makes belongs to the repository owner (root) on disk: a set-id bit would
/// leave a root-owned setuid program in the work tree for any local user to run.
const MODE_ARG: &[(libc::c_long, u8)] = &[
    (libc::SYS_chmod, 1),
    (libc::SYS_fchmod, 1),
    (libc::SYS_fchmodat, 2),
    (libc::SYS_fchmodat2, 2),
    (libc::SYS_creat, 1),
    (libc::SYS_open, 2),
    (libc::SYS_openat, 3),
];

/// Namespace flags `clone` may not carry.
const CLONE_NS_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError::Unavailable(e.to_string()))
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, SeccompError> {
    Ok(SeccompRule::new(conds)?)
}

fn cond(arg: u8, op: Op, value: u64) -> Result<Cond, SeccompError> {
    Ok(Cond::new(arg, Len::Qword, op, value)?)
}

/// The `EPERM` filter. `network`: settings grant tools TCP (to ports Landlock checks).
fn eperm_rules(network: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|s| (*s, Vec::new())).collect();
    // socket(domain, type, protocol): AF_UNIX always; AF_INET/AF_INET6 stream
    // sockets when network is granted; every other family refused.
    let mut socket = Vec::new();
    let mut other_family = vec![cond(0, Op::Ne, libc::AF_UNIX as u64)?];
    if network {
        other_family.push(cond(0, Op::Ne, libc::AF_INET as u64)?);
        other_family.push(cond(0, Op::Ne, libc::AF_INET6 as u64)?);
        for family in [libc::AF_INET, libc::AF_INET6] {
            // Every type but a stream (the kernel's `SOCK_TYPE_MASK` is the low four
            // bits): datagrams, raw, `SOCK_SEQPACKET`, `SOCK_DCCP`, `SOCK_PACKET` and
            // any a later kernel adds.
            for kind in (0..16).filter(|k| *k != libc::SOCK_STREAM) {
                socket.push(rule(vec![
                    cond(0, Op::Eq, family as u64)?,
                    cond(1, Op::MaskedEq(0xf), kind as u64)?,
                ])?);
            }
            // A stream socket of another protocol than TCP (MPTCP, SCTP): Landlock's
            // port rules check TCP sockets alone, so one would connect to any port.
            socket.push(rule(vec![
                cond(0, Op::Eq, family as u64)?,
                cond(1, Op::MaskedEq(0xf), libc::SOCK_STREAM as u64)?,
                cond(2, Op::Ne, 0)?,
                cond(2, Op::Ne, libc::IPPROTO_TCP as u64)?,
            ])?);
        }
    }
    socket.push(rule(other_family)?);
    if network {
        // listen() on an unbound TCP socket binds an ephemeral port on every address
        // without the bind() Landlock checks: in the host's network namespace a tool
        // would serve the network. No listening at all then (AF_UNIX included: the
        // filter cannot see the socket's family).
        rules.insert(libc::SYS_listen, Vec::new());
    }
    rules.insert(libc::SYS_socket, socket);
    // mknod(path, mode, dev) / mknodat(dirfd, path, mode, dev): no device nodes, no
    // set-id bits.
    for (call, arg) in [(libc::SYS_mknod, 1u8), (libc::SYS_mknodat, 2u8)] {
        let mut r = Vec::new();
        for kind in [libc::S_IFCHR, libc::S_IFBLK] {
            r.push(rule(vec![cond(arg, Op::MaskedEq(libc::S_IFMT as u64), kind as u64)?])?);
        }
        for bit in [libc::S_ISUID, libc::S_ISGID] {
            r.push(rule(vec![cond(arg, Op::MaskedEq(bit as u64), bit as u64)?])?);
        }
        rules.insert(call, r);
    }
    for (call, arg) in MODE_ARG {
        let mut r = Vec::new();
        for bit in [libc::S_ISUID, libc::S_ISGID] {
            r.push(rule(vec![cond(*arg, Op::MaskedEq(bit as u64), bit as u64)?])?);
        }
        rules.insert(*call, r);
    }
    // sendto/sendmsg/sendmmsg with MSG_FASTOPEN: TCP Fast Open connects an
    // unconnected socket without the connect() that Landlock checks against the
    // granted ports.
    for (call, arg) in [(libc::SYS_sendto, 3u8), (libc::SYS_sendmsg, 2), (libc::SYS_sendmmsg, 3)] {
        let fast_open = libc::MSG_FASTOPEN as u64;
        rules.insert(call, vec![rule(vec![cond(arg, Op::MaskedEq(fast_open), fast_open)?])?]);
    }
    // prlimit64(pid, ...) on any process but the caller (pid 0).
    rules.insert(libc::SYS_prlimit64, vec![rule(vec![cond(0, Op::Ne, 0)?])?]);
    let mut clone = Vec::new();
    for flag in CLONE_NS_FLAGS {
        clone.push(rule(vec![cond(0, Op::MaskedEq(*flag as u64), *flag as u64)?])?);
    }
    rules.insert(libc::SYS_clone, clone);
    Ok(rules)
}

/// Calls answered with `ENOSYS`: their flags or mode sit in memory a filter cannot
/// read (`clone3`'s namespace flags, `openat2`'s mode); libc falls back to `clone`
/// and `openat`, which the `EPERM` filter checks.
const NOT_IMPLEMENTED: &[libc::c_long] = &[libc::SYS_clone3, libc::SYS_openat2];

/// Refuses every x32 syscall with `EPERM`. x32 calls share x86_64's audit
/// architecture, so the architecture check of the other programs lets them through,
/// and their numbers (`0x40000000 | nr`) match none of their rules: on a kernel built
/// with x32 support, `socket` called through x32 would pass the `EPERM` filter.
/// `seccompiler` matches exact syscall numbers and has no range test on the number,
/// so this one comparison is written out (four instructions: load the number, jump if
/// at or above the x32 bit, return `EPERM`, return allow).
fn x32_guard() -> BpfProgram {
    // Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0x00) | BPF_W (0x00) | BPF_ABS (0x20)
    const BPF_JMP_JGE_K: u16 = 0x35; // BPF_JMP (0x05) | BPF_JGE (0x30) | BPF_K (0x00)
    const BPF_RET_K: u16 = 0x06; // BPF_RET (0x06) | BPF_K (0x00)
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.nr is at offset 0.
        op(BPF_LD_W_ABS, 0, 0, 0),
        op(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        op(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
}

/// The programs: the `EPERM` filter, [`NOT_IMPLEMENTED`] answered with `ENOSYS`, and
/// on x86_64 the [`x32_guard`].
pub fn programs(network: bool) -> Result<Vec<BpfProgram>, SeccompError> {
    let arch = arch()?;
    let eperm = SeccompFilter::new(
        eperm_rules(network)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    let clone3 = SeccompFilter::new(
        NOT_IMPLEMENTED.iter().map(|s| (*s, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    let mut progs = vec![eperm.try_into()?, clone3.try_into()?];
    if cfg!(target_arch = "x86_64") {
        progs.push(x32_guard());
    }
    Ok(progs)
}

/// Installs the filter on the calling thread and what it starts afterwards. Sets
/// `no_new_privs` first (the kernel requires it of an unprivileged caller).
pub fn install(network: bool) -> Result<(), SeccompError> {
    if super::simulated_missing("seccomp") {
        return Err(SeccompError::Unavailable(format!(
            "simulated by {}",
            super::SIMULATE_MISSING_ENV
        )));
    }
    let progs = programs(network)?;
    kernel::seccomp::install(&progs).map_err(|e| match e {
        kernel::seccomp::InstallError::NoNewPrivs(e) => SeccompError::Unavailable(e.to_string()),
        kernel::seccomp::InstallError::Apply(e) => SeccompError::Install(e),
    })
}

/// Whether this kernel accepts a seccomp filter (`runtime check`): reads the mode of
/// the calling process (`PR_GET_SECCOMP` answers `EINVAL` without seccomp) and builds
/// the filter.
pub fn probe() -> Result<(), SeccompError> {
    if super::simulated_missing("seccomp") {
        return Err(SeccompError::Unavailable(format!(
            "simulated by {}",
            super::SIMULATE_MISSING_ENV
        )));
    }
    kernel::seccomp::mode().map_err(|e| SeccompError::Unavailable(e.to_string()))?;
    programs(false).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::probes;

    /// Runs `f` on a thread of its own after installing the filter there (a filter
    /// binds the thread that installs it and what that thread starts, nothing else);
    /// returns what `f` returned, 99 when the filter could not be installed.
    fn in_filtered_thread(network: bool, f: impl FnOnce() -> i32 + Send + 'static) -> i32 {
        std::thread::spawn(move || match install(network) {
            Ok(()) => f(),
            Err(_) => 99,
        })
        .join()
        .unwrap()
    }

    /// Whether `r` failed with `errno`.
    fn refused<T>(r: std::io::Result<T>, errno: i32) -> bool {
        r.is_err_and(|e| e.raw_os_error() == Some(errno))
    }

    #[test]
    fn sockets_other_than_unix_are_refused() {
        let code = in_filtered_thread(false, || {
            let unix = probes::socket(libc::AF_UNIX, libc::SOCK_STREAM);
            let udp = probes::socket(libc::AF_INET, libc::SOCK_DGRAM);
            let tcp = probes::socket(libc::AF_INET6, libc::SOCK_STREAM);
            i32::from(unix.is_ok()) + 2 * i32::from(refused(udp, libc::EPERM)) + 4 * i32::from(tcp.is_err())
        });
        assert_eq!(code, 7, "unix allowed, udp and tcp refused with EPERM");
    }

    /// An x32 `socket` call answers `EPERM` (the guard) rather than `ENOSYS` (a kernel
    /// without x32) or a socket (a kernel with it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_syscalls_are_refused() {
        let unfiltered = probes::x32_getpid().err().and_then(|e| e.raw_os_error()).unwrap_or(0);
        assert_ne!(
            unfiltered,
            libc::EPERM,
            "without the filter the call is not refused by it"
        );
        let code = in_filtered_thread(false, || {
            let sock = probes::x32_udp_socket();
            let pid = probes::x32_getpid();
            let native = probes::native_getpid();
            i32::from(refused(sock, libc::EPERM))
                + 2 * i32::from(pid.is_err())
                + 4 * i32::from(native.is_ok_and(|p| p > 0))
        });
        assert_eq!(code, 7, "x32 calls refused with EPERM, native calls untouched");
    }

    #[test]
    fn granted_network_is_tcp_only() {
        let code = in_filtered_thread(true, || {
            let tcp = probes::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC);
            let udp = probes::socket(libc::AF_INET, libc::SOCK_DGRAM);
            let raw = probes::socket(libc::AF_PACKET, libc::SOCK_RAW);
            let tcp_named = probes::socket_of(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP);
            // `SOCK_DCCP` and a type no kernel has yet: the filter's `EPERM`, not the
            // kernel's "type not supported".
            let dccp = probes::socket_of(libc::AF_INET, 6, 0);
            let unknown = probes::socket_of(libc::AF_INET6, 11 | libc::SOCK_CLOEXEC, 0);
            i32::from(tcp.is_ok())
                + 2 * i32::from(udp.is_err())
                + 4 * i32::from(raw.is_err())
                + 8 * i32::from(tcp_named.is_ok())
                + 16 * i32::from(refused(dccp, libc::EPERM))
                + 32 * i32::from(refused(unknown, libc::EPERM))
        });
        assert_eq!(code, 63);
    }

    /// MPTCP and SCTP stream sockets: Landlock's TCP port rules do not apply to them,
    /// so a tool with one granted port would reach every port. The kernel makes them
    /// outside the filter (the attack would run), and the filter refuses them.
    #[test]
    fn granted_network_refuses_stream_sockets_landlock_cannot_judge() {
        use crate::test_skip::{skip, Capability};
        for (protocol, cap) in [
            (libc::IPPROTO_MPTCP, Capability::Mptcp),
            (libc::IPPROTO_SCTP, Capability::Sctp),
        ] {
            if let Err(e) = probes::socket_of(libc::AF_INET, libc::SOCK_STREAM, protocol) {
                skip(cap, &format!("this kernel makes no such socket ({e})"));
                continue;
            }
            let code = in_filtered_thread(true, move || {
                let v4 = probes::socket_of(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, protocol);
                let v6 = probes::socket_of(libc::AF_INET6, libc::SOCK_STREAM, protocol);
                i32::from(refused(v4, libc::EPERM)) + 2 * i32::from(refused(v6, libc::EPERM))
            });
            assert_eq!(code, 3, "{cap:?} stream sockets refused with EPERM");
        }
    }

    #[test]
    fn ptrace_prlimit_mknod_and_unshare_are_refused() {
        let code = in_filtered_thread(false, || {
            let parent = std::os::unix::process::parent_id() as libc::pid_t;
            [
                refused(probes::ptrace_traceme(), libc::EPERM),
                refused(probes::prlimit_nofile(parent), libc::EPERM),
                probes::prlimit_nofile(0).is_ok(),
                refused(probes::unshare_user_namespace(), libc::EPERM),
                refused(probes::mknod_char_device(c"/nonexistent-dir/dev"), libc::EPERM),
            ]
            .iter()
            .enumerate()
            .map(|(i, ok)| i32::from(*ok) << i)
            .sum()
        });
        assert_eq!(code, 31);
    }
}
