//! Tool execution, run inside the sandboxed worker process. File tools work relative
//! to the repository root; `run_command` runs `/bin/sh -c` in its own process group
//! with inherited descriptors closed, a scrubbed environment (no API keys), a timeout
//! that kills the whole group, and an output cap. Kernel refusals (EACCES, EPERM,
//! EROFS) are reported as `PERMISSION_DENIED` with `kernel_denied` set. A running
//! command is also killed when the process is interrupted (SIGTERM/SIGINT), once
//! [`install_interrupt_handlers`] has been called; the flag lives here because this
//! is the code that acts on it.

use super::{ErrorClass, ToolArgs, ToolRequest, ToolResult};
use crate::env::PASSTHROUGH_ENV;
use std::io::{ErrorKind, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const MAX_LIST: usize = 1000;
const MAX_GREP_MATCHES: usize = 500;
const MAX_GREP_FILE: u64 = 1 << 20;
/// The most bytes `read_file` and `edit_file` read from one file (with `offset` and
/// `limit`, lines past this are out of reach): a file grown without bound, or a device
/// the path leads to, never fills the worker's memory.
const MAX_READ_FILE: u64 = 8 << 20;

/// Makes SIGTERM and SIGINT kill the running command (with its process group)
/// instead of the process, so the caller goes on serving and nothing is orphaned.
pub fn install_interrupt_handlers() {
    kernel::signal::catch_interrupts();
}

/// True once after SIGTERM/SIGINT reached the process.
fn take_interrupt() -> bool {
    kernel::signal::take_interrupt()
}

/// Where tools run.
#[derive(Debug, Clone)]
pub struct ExecContext {
    pub root: PathBuf,
    /// Per-run scratch directory: `HOME` and `TMPDIR` of model-run commands.
    pub scratch: PathBuf,
    /// Environment for commands (already scrubbed by the caller).
    pub env: Vec<(String, String)>,
}

impl ExecContext {
    /// The scrubbed environment model-run commands get.
    pub fn scrubbed_env(scratch: &Path) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = PASSTHROUGH_ENV
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".into(), DEFAULT_PATH.into()));
        }
        let s = scratch.to_string_lossy().to_string();
        env.push(("HOME".into(), s.clone()));
        env.push(("TMPDIR".into(), s));
        env.push(("TERM".into(), "dumb".into()));
        env.push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
        env.push(("GIT_CONFIG_NOSYSTEM".into(), "1".into()));
        env
    }
}

/// Executes one request.
pub fn execute(ctx: &ExecContext, req: &ToolRequest) -> ToolResult {
    let start = Instant::now();
    let mut r = match &req.args {
        ToolArgs::ReadFile { path, offset, limit } => read_file(ctx, path, *offset, *limit, req.output_limit),
        ToolArgs::ListDir { path } => list_dir(ctx, path, req.output_limit),
        ToolArgs::Grep { pattern, path } => grep(ctx, pattern, path, &req.masked, req.output_limit),
        ToolArgs::WriteFile { path, content } => write_file(ctx, path, content),
        ToolArgs::EditFile { path, old, new } => edit_file(ctx, path, old, new),
        ToolArgs::RunCommand { command, .. } => run_command(ctx, req, command, Duration::from_millis(req.timeout_ms)),
    };
    r.call_id = req.call_id.clone();
    r.duration_ms = start.elapsed().as_millis() as u64;
    r
}

fn ok(output: String, truncated: bool) -> ToolResult {
    ToolResult {
        call_id: String::new(),
        error: None,
        output,
        truncated,
        duration_ms: 0,
        kernel_denied: false,
        written_back: None,
    }
}

fn io_error(path: &str, e: &std::io::Error, writing: bool) -> ToolResult {
    let kernel = matches!(
        e.raw_os_error(),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::EXDEV)
    );
    let class = match e.kind() {
        ErrorKind::NotFound => ErrorClass::NotFound,
        _ if kernel => ErrorClass::PermissionDenied,
        _ if writing => ErrorClass::SideEffectUncertain,
        _ => ErrorClass::Failed,
    };
    let mut r = ToolResult::error("", class, format!("{path}: {e}"));
    r.kernel_denied = kernel;
    r
}

fn resolve(ctx: &ExecContext, path: &str) -> PathBuf {
    if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        ctx.root.join(path)
    }
}

fn read_file(ctx: &ExecContext, path: &str, offset: Option<usize>, limit: Option<usize>, cap: usize) -> ToolResult {
    let full = resolve(ctx, path);
    let meta = match std::fs::metadata(&full) {
        Ok(m) => m,
        Err(e) => return io_error(path, &e, false),
    };
    if meta.is_dir() {
        return ToolResult::error(
            "",
            ErrorClass::InvalidArguments,
            format!("{path} is a directory; use list_dir"),
        );
    }
    if offset.is_none() && limit.is_none() && meta.len() as usize > cap {
        return ToolResult::error(
            "",
            ErrorClass::OutputTooLarge,
            format!(
                "{path} is {} bytes, over the {cap}-byte limit; read it in parts with `offset` and `limit` (lines)",
                meta.len()
            ),
        );
    }
    let bytes = match crate::regular::read(&full, MAX_READ_FILE) {
        Ok(b) => b,
        Err(e) => return io_error(path, &e, false),
    };
    let text = String::from_utf8_lossy(&bytes);
    let start = offset.unwrap_or(1).saturating_sub(1);
    let lines: Vec<&str> = text.lines().skip(start).take(limit.unwrap_or(usize::MAX)).collect();
    let (out, truncated) = cap_text(lines.join("\n"), cap);
    ok(out, truncated)
}

fn list_dir(ctx: &ExecContext, path: &str, cap: usize) -> ToolResult {
    let rd = match std::fs::read_dir(resolve(ctx, path)) {
        Ok(r) => r,
        Err(e) => return io_error(path, &e, false),
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                format!("{n}/")
            } else {
                n
            }
        })
        .collect();
    names.sort();
    let more = names.len() > MAX_LIST;
    names.truncate(MAX_LIST);
    let (out, truncated) = cap_text(names.join("\n"), cap);
    ok(if names.is_empty() { "(empty)".into() } else { out }, truncated || more)
}

fn grep(ctx: &ExecContext, pattern: &str, path: &str, masked: &[String], cap: usize) -> ToolResult {
    let re = match regex::Regex::new(pattern) {
        Ok(r) => r,
        Err(e) => return ToolResult::error("", ErrorClass::InvalidArguments, format!("invalid pattern: {e}")),
    };
    let masks = match mask_set(masked) {
        Ok(m) => m,
        Err(e) => return ToolResult::error("", ErrorClass::InvalidArguments, format!("invalid mask: {e}")),
    };
    let base = resolve(ctx, path);
    if let Err(e) = std::fs::metadata(&base) {
        return io_error(path, &e, false);
    }
    let mut hits = GrepHits::default();
    let mut stack = vec![base];
    while let Some(p) = stack.pop() {
        if hits.matches >= MAX_GREP_MATCHES || hits.out.len() > cap {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            push_searched_children(&p, &mut stack);
            continue;
        }
        // Checked before the file's type: in the worker's mount namespace a masked
        // file is `/dev/null` mounted over it.
        let shown = p.strip_prefix(&ctx.root).unwrap_or(&p).display().to_string();
        if masks.is_match(&shown) || masks.is_match(&p) {
            hits.hidden += 1;
        } else if meta.is_file() && meta.len() <= MAX_GREP_FILE {
            hits.search(&p, &shown, &re);
        }
    }
    hits.into_result(cap)
}

/// What `grep` found so far: the lines it shows, how many matched, and how many
/// files a `Read` deny rule kept it from searching.
#[derive(Default)]
struct GrepHits {
    out: String,
    matches: usize,
    hidden: usize,
}

impl GrepHits {
    /// Adds the lines of the regular file `p` (shown as `shown`) that `re` matches;
    /// a file it cannot read, or a binary one (a NUL byte), adds nothing.
    fn search(&mut self, p: &Path, shown: &str, re: &regex::Regex) {
        let Ok(bytes) = crate::regular::read(p, MAX_GREP_FILE) else {
            return;
        };
        if bytes.contains(&0) {
            return;
        }
        let text = String::from_utf8_lossy(&bytes);
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                self.out.push_str(&format!(
                    "{shown}:{}: {}\n",
                    i + 1,
                    line.chars().take(300).collect::<String>()
                ));
                self.matches += 1;
                if self.matches >= MAX_GREP_MATCHES {
                    break;
                }
            }
        }
    }

    fn into_result(mut self, cap: usize) -> ToolResult {
        if self.hidden > 0 {
            self.out.push_str(&format!(
                "({} file(s) not searched: a Read deny rule covers them)\n",
                self.hidden
            ));
        }
        let (out, truncated) = cap_text(self.out, cap);
        ok(
            if self.matches == 0 && self.hidden == 0 {
                "(no matches)".into()
            } else {
                out
            },
            truncated || self.matches >= MAX_GREP_MATCHES,
        )
    }
}

/// Pushes the entries of the directory `p` on `stack`, in name order to be popped,
/// unless `p` is a directory `grep` passes over (`.git`, `.runtime`, `target`).
fn push_searched_children(p: &Path, stack: &mut Vec<PathBuf>) {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if name == ".git" || name == ".runtime" || name == "target" {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(p) {
        let mut kids: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        kids.sort();
        stack.extend(kids.into_iter().rev());
    }
}

/// The globs a walking tool must pass over, compiled as the rules compile them.
pub(crate) fn mask_set(masked: &[String]) -> Result<globset::GlobSet, globset::Error> {
    let mut set = globset::GlobSetBuilder::new();
    for m in masked {
        set.add(globset::GlobBuilder::new(m).literal_separator(true).build()?);
    }
    set.build()
}

fn write_file(ctx: &ExecContext, path: &str, content: &str) -> ToolResult {
    use std::io::Write;
    let full = resolve(ctx, path);
    if let Some(parent) = full.parent() {
        if let Err(e) = std::fs::create_dir_all(parent) {
            return io_error(path, &e, true);
        }
    }
    let mut f = match std::fs::OpenOptions::new().write(true).create_new(true).open(&full) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            return ToolResult::error(
                "",
                ErrorClass::Failed,
                format!(
                    "{path} already exists; records are never rewritten (edit_file works on files this run created)"
                ),
            )
        }
        Err(e) => return io_error(path, &e, true),
    };
    match f.write_all(content.as_bytes()) {
        Ok(()) => ok(format!("wrote {} bytes to {path}", content.len()), false),
        Err(e) => io_error(path, &e, true),
    }
}

fn edit_file(ctx: &ExecContext, path: &str, old: &str, new: &str) -> ToolResult {
    let full = resolve(ctx, path);
    let text = match crate::regular::read(&full, MAX_READ_FILE)
        .and_then(|b| String::from_utf8(b).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.utf8_error())))
    {
        Ok(t) => t,
        Err(e) => return io_error(path, &e, false),
    };
    match text.matches(old).count() {
        1 => {}
        0 => {
            return ToolResult::error(
                "",
                ErrorClass::InvalidArguments,
                format!("`old` does not occur in {path}"),
            )
        }
        n => {
            return ToolResult::error(
                "",
                ErrorClass::InvalidArguments,
                format!("`old` occurs {n} times in {path}; give more context"),
            )
        }
    }
    let written = crate::regular::open(&full, true).and_then(|mut f| {
        use std::io::Write;
        f.set_len(0)?;
        f.write_all(text.replacen(old, new, 1).as_bytes())
    });
    match written {
        Ok(()) => ok(format!("edited {path}"), false),
        Err(e) => io_error(path, &e, true),
    }
}

fn run_command(ctx: &ExecContext, req: &ToolRequest, command: &str, timeout: Duration) -> ToolResult {
    let cap = req.output_limit;
    let apart = if req.apart {
        match ApartHome::make(&ctx.scratch) {
            Ok(home) => Some(home),
            Err(e) => return io_error("a fresh HOME for the command", &e, false),
        }
    } else {
        None
    };
    let spawn = |argv: Option<Vec<&str>>| {
        let mut cmd = sandboxed_command(ctx, command, argv.as_deref());
        cmd.env(crate::env::CALL_ID_ENV, &req.call_id);
        if let Some(home) = &apart {
            cmd.env("HOME", &home.0).env("TMPDIR", &home.0);
        }
        cmd.spawn()
    };
    let argv = crate::shell::plain_argv(command);
    let program = argv.as_ref().map_or("/bin/sh", |a| a[0]).to_string();
    let spawned = match spawn(argv) {
        // A file without `#!` is a shell script to `execvp`, and so to the shell.
        Err(e) if e.raw_os_error() == Some(libc::ENOEXEC) => spawn(None),
        spawned => spawned,
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return io_error(&program, &e, false),
    };
    let (captures, ending) = capture_output(&mut child, cap, timeout);
    let status = child.wait();
    let output = CommandOutput::collect(captures, cap);
    let code = status.as_ref().ok().and_then(|s| s.code());
    drop(apart);
    match ending {
        Ending::Finished => output.into_result(code),
        Ending::TimedOut => output.killed(format!("killed after {} ms", timeout.as_millis())),
        Ending::Cancelled => output.killed("killed: the fire was cancelled".to_string()),
    }
}

/// A fresh, empty directory under the scratch for one command run apart; removed
/// with everything in it when dropped. Its name is random and it is made with
/// `mkdir` (which fails on anything already there, a link included), so nothing an
/// earlier command left can stand in for it.
struct ApartHome(PathBuf);

impl ApartHome {
    fn make(scratch: &Path) -> std::io::Result<ApartHome> {
        let dir = scratch.join(format!(".apart-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir)?;
        Ok(ApartHome(dir))
    }
}

impl Drop for ApartHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The process for `command`: run directly as `argv` when it is a simple external
/// command (one process fewer), else (`None`) through `/bin/sh -c`; in the root, with
/// the scrubbed environment, in its own process group, inherited descriptors closed.
///
/// In the sandbox the worker is PID 1 of its PID namespace, so the kernel kills the
/// command with the worker and no `pre_exec` hook is needed: with none, and an
/// absolute program path, the standard library spawns with `posix_spawn` (a `vfork`)
/// instead of copying the worker. Elsewhere the child sets its own death signal.
fn sandboxed_command(ctx: &ExecContext, command: &str, argv: Option<&[&str]>) -> Command {
    let mut cmd = match argv {
        Some(argv) => {
            let mut c = Command::new(program_path(argv[0], ctx));
            c.arg0(argv[0]).args(&argv[1..]);
            c
        }
        None => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(command);
            c
        }
    };
    cmd.current_dir(&ctx.root)
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if kernel::process::is_namespace_init() {
        kernel::spawn::mark_descriptors_close_on_exec();
    } else {
        kernel::spawn::close_inherited_descriptors(&mut cmd);
        // Die with the worker rather than outlive it.
        kernel::spawn::die_with_parent(&mut cmd);
    }
    cmd
}

/// Where `program` is found on the command's `PATH` (relative entries taken from the
/// root, where the command runs), as `execvp` would look: the first regular file this
/// process may execute (one it may not is passed over, as `execvp` passes over
/// `EACCES`). A name with a slash, or one found nowhere, is left as it is (then the
/// spawn reports it missing).
fn program_path(program: &str, ctx: &ExecContext) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    let path = ctx
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| ctx.root.join(dir).join(program))
        .find(|full| {
            std::fs::metadata(full).is_ok_and(|m| m.is_file())
                && rustix::fs::access(full, rustix::fs::Access::EXEC_OK).is_ok()
        })
        .unwrap_or_else(|| PathBuf::from(program))
}

/// What a reader kept of one output stream: its first `cap` bytes, the last `cap`
/// bytes after those, and how many bytes the stream wrote in all.
#[derive(Debug, Default)]
struct Capture {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    total: usize,
}

impl Capture {
    fn push(&mut self, bytes: &[u8], cap: usize) {
        self.total += bytes.len();
        let room = cap.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..room]);
        self.tail.extend(&bytes[room..]);
        let excess = self.tail.len().saturating_sub(cap);
        self.tail.drain(..excess);
    }

    /// Bytes the capture dropped between its head and its tail.
    fn dropped(&self) -> usize {
        self.total - self.head.len() - self.tail.len()
    }

    fn kept(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        out.extend(self.tail.iter());
        out
    }
}

/// How a command's run ended.
enum Ending {
    /// Its output streams closed before the deadline.
    Finished,
    /// Killed at the deadline.
    TimedOut,
    /// Killed because the fire was cancelled.
    Cancelled,
}

/// How long a killed command's output streams get to drain.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// Reads `child`'s stdout and stderr in this thread as they come (`poll`), each
/// keeping its first and last `cap` bytes, until both streams close and the child has
/// exited (a command that sent its output elsewhere, `make >log 2>&1`, is still held
/// to its deadline). At the deadline, or when the fire is cancelled, kills the child
/// and its process group and gives the streams [`DRAIN_AFTER_KILL`] more before it
/// stops reading. The child's exit is watched through a pidfd where the kernel has
/// one, else by asking every few milliseconds.
fn capture_output(child: &mut std::process::Child, cap: usize, timeout: Duration) -> ([Capture; 2], Ending) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let pgid = child.id();
    let exit_fd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(child),
        rustix::process::PidfdFlags::empty(),
    )
    .ok();
    let mut running = true;
    let mut open: Vec<(usize, std::fs::File)> = [
        child.stdout.take().map(std::os::fd::OwnedFd::from),
        child.stderr.take().map(std::os::fd::OwnedFd::from),
    ]
    .into_iter()
    .enumerate()
    .filter_map(|(i, fd)| fd.map(|fd| (i, std::fs::File::from(fd))))
    .collect();
    let mut captures = [Capture::default(), Capture::default()];
    let mut ending = Ending::Finished;
    let mut stop_at = Instant::now() + timeout;
    let mut buf = [0u8; 8192];
    while !open.is_empty() || running {
        let now = Instant::now();
        let interrupted = matches!(ending, Ending::Finished) && take_interrupt();
        if interrupted || now >= stop_at {
            if !matches!(ending, Ending::Finished) {
                break;
            }
            // Our own child, and its process group (which it may have left).
            let _ = child.kill();
            let _ = kernel::signal::kill_group(pgid, kernel::signal::Signal::Kill);
            ending = if interrupted {
                Ending::Cancelled
            } else {
                Ending::TimedOut
            };
            stop_at = now + DRAIN_AFTER_KILL;
        }
        let asking = open.is_empty() && exit_fd.is_none();
        let most = Duration::from_millis(if asking { 5 } else { 50 });
        let wait = stop_at.saturating_duration_since(now).min(most);
        let mut fds: Vec<PollFd> = open.iter().map(|(_, f)| PollFd::new(f, PollFlags::IN)).collect();
        if let (true, Some(fd)) = (running, &exit_fd) {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        // EINTR (a signal) and a timeout both go round again.
        let _ = poll(&mut fds, Timespec::try_from(wait).ok().as_ref());
        let ready: Vec<bool> = fds.iter().map(|fd| !fd.revents().is_empty()).collect();
        drop(fds);
        if running && (open.is_empty() || ready.get(open.len()).copied().unwrap_or(false)) {
            running = matches!(child.try_wait(), Ok(None));
        }
        let mut index = 0;
        open.retain_mut(|(stream, file)| {
            let is_ready = ready[index];
            index += 1;
            if !is_ready {
                return true;
            }
            match file.read(&mut buf) {
                Ok(0) => false,
                Ok(n) => {
                    captures[*stream].push(&buf[..n], cap);
                    true
                }
                Err(e) => e.kind() == ErrorKind::Interrupted,
            }
        });
    }
    (captures, ending)
}

/// A command's output as the model sees it.
struct CommandOutput {
    /// Stdout, then `[stderr]` and stderr when there is any; capped.
    text: String,
    stderr: String,
    truncated: bool,
}

impl CommandOutput {
    /// Joins the captured streams (stdout, then stderr) and caps the text, keeping
    /// its head and its tail with a marker of what was cut in between (the end of a
    /// command's output is often what matters: the error, the summary line).
    fn collect(captures: [Capture; 2], cap: usize) -> CommandOutput {
        let dropped: usize = captures.iter().map(Capture::dropped).sum();
        let mut streams = captures.iter().map(Capture::kept);
        let mut bytes = streams.next().unwrap_or_default();
        let stderr = streams.next().unwrap_or_default();
        if !stderr.is_empty() {
            if !bytes.is_empty() && !bytes.ends_with(b"\n") {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(b"[stderr]\n");
            bytes.extend_from_slice(&stderr);
        }
        let (text, truncated) = head_and_tail(&bytes, dropped, cap);
        CommandOutput {
            text,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            truncated,
        }
    }

    /// The result of a command killed before it finished; `why` heads the output.
    fn killed(self, why: String) -> ToolResult {
        let mut r = ToolResult::error("", ErrorClass::Timeout, format!("{why}\n{}", self.text));
        r.truncated = self.truncated;
        r
    }

    /// The result of a command that ran to its end (`code` is `None` after a signal).
    fn into_result(self, code: Option<i32>) -> ToolResult {
        let kernel_denied = [
            "Permission denied",
            "Operation not permitted",
            "Read-only file system",
            "Invalid cross-device link",
        ]
        .iter()
        .any(|m| self.stderr.contains(m));
        match code {
            Some(0) => {
                let mut r = ok(self.text, self.truncated);
                r.kernel_denied = kernel_denied;
                r
            }
            other => {
                let class = if kernel_denied {
                    ErrorClass::PermissionDenied
                } else {
                    ErrorClass::Failed
                };
                let mut r = ToolResult::error(
                    "",
                    class,
                    format!(
                        "exit status {}\n{}",
                        other.map(|c| c.to_string()).unwrap_or_else(|| "signal".into()),
                        self.text
                    ),
                );
                r.truncated = self.truncated;
                r.kernel_denied = kernel_denied;
                r
            }
        }
    }
}

/// `kept` (the bytes a capture kept, `dropped` more having been cut from its middle) in
/// at most `cap` bytes: whole when it fits, else its first half and its last bytes
/// around a marker that says how much was cut. Whether anything was cut is returned.
fn head_and_tail(kept: &[u8], dropped: usize, cap: usize) -> (String, bool) {
    if dropped == 0 && kept.len() <= cap {
        return (String::from_utf8_lossy(kept).into_owned(), false);
    }
    let marker_room = 64;
    let head = (cap / 2).min(kept.len());
    let tail = cap.saturating_sub(head + marker_room).min(kept.len() - head);
    let cut = kept.len() - head - tail + dropped;
    let mut out = String::from_utf8_lossy(&kept[..head]).into_owned();
    out.push_str(&format!("\n[... {cut} bytes cut ...]\n"));
    out.push_str(&String::from_utf8_lossy(&kept[kept.len() - tail..]));
    (out, true)
}

/// Cuts `text` to at most `cap` bytes on a char boundary.
pub(crate) fn cap_text(mut text: String, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text, false);
    }
    let mut cut = cap;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grep_passes_over_masked_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join(".env"), "KEY=secret\n").unwrap();
        std::fs::write(root.join("sub/.env"), "KEY=secret\n").unwrap();
        std::fs::write(root.join("notes.md"), "KEY is documented\n").unwrap();
        let ctx = ExecContext {
            root: root.clone(),
            scratch: root.join("scratch"),
            env: vec![],
        };
        let mut req = ToolRequest {
            apart: false,
            masked: vec!["**/.env".into()],
            call_id: "c".into(),
            args: ToolArgs::Grep {
                pattern: "KEY".into(),
                path: ".".into(),
            },
            timeout_ms: 1000,
            output_limit: 10_000,
        };
        let r = execute(&ctx, &req);
        assert!(r.output.contains("notes.md:1"), "{}", r.output);
        assert!(!r.output.contains("secret"), "{}", r.output);
        assert!(r.output.contains("2 file(s) not searched"), "{}", r.output);
        req.masked.clear();
        assert!(
            execute(&ctx, &req).output.contains("secret"),
            "the mask is what hid them"
        );
    }

    #[test]
    fn long_output_keeps_its_head_and_tail_around_a_marker() {
        let mut c = Capture::default();
        let line = |i: usize| format!("line {i:05}\n");
        for i in 0..10_000 {
            c.push(line(i).as_bytes(), 1000);
        }
        let (text, cut) = head_and_tail(&c.kept(), c.dropped(), 1000);
        assert!(cut);
        assert!(text.len() <= 1000 + 40, "{}", text.len());
        assert!(text.starts_with("line 00000\n"), "{text}");
        assert!(text.ends_with("line 09999\n"), "{text}");
        let marker = text.lines().find(|l| l.starts_with("[... ")).unwrap();
        let kept_lines = text.lines().filter(|l| l.starts_with("line ")).count();
        let cut_bytes: usize = marker
            .trim_start_matches("[... ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            cut_bytes + text.len() - marker.len() - 2,
            10_000 * 11,
            "the marker counts what was cut"
        );
        assert!(kept_lines > 50);
        let (short, cut) = head_and_tail(b"short\n", 0, 1000);
        assert_eq!((short.as_str(), cut), ("short\n", false));
    }

    fn ctx() -> (tempfile::TempDir, ExecContext) {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join(".runtime/scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let env = ExecContext::scrubbed_env(&scratch);
        let root = dir.path().to_path_buf();
        (dir, ExecContext { root, scratch, env })
    }

    /// A `run_command` request of `line`, with the default timeout.
    fn command(line: &str) -> ToolRequest {
        req(ToolArgs::RunCommand {
            command: line.into(),
            timeout_s: None,
        })
    }

    fn req(args: ToolArgs) -> ToolRequest {
        ToolRequest {
            apart: false,
            masked: Vec::new(),
            call_id: "c".into(),
            args,
            timeout_ms: 5000,
            output_limit: 1000,
        }
    }

    #[test]
    fn a_command_run_apart_sees_a_fresh_home_not_the_shared_scratch() {
        let (_d, c) = ctx();
        let shared = execute(&c, &command("echo planted > \"$HOME/.profile\"; echo \"$HOME\""));
        assert_eq!(shared.output.trim(), c.scratch.to_string_lossy(), "{shared:?}");
        let mut apart = command("echo \"$HOME $TMPDIR\"; ls -A \"$HOME\" | wc -l; touch \"$TMPDIR/t\"");
        apart.apart = true;
        let r = execute(&c, &apart);
        assert_eq!(r.error, None, "{r:?}");
        let mut lines = r.output.lines();
        let homes: Vec<&str> = lines.next().unwrap().split(' ').collect();
        assert_eq!(homes[0], homes[1], "HOME and TMPDIR are the one fresh directory");
        assert_ne!(homes[0], c.scratch.to_string_lossy(), "not the shared scratch");
        assert!(homes[0].starts_with(&*c.scratch.to_string_lossy()));
        assert_eq!(lines.next().map(str::trim), Some("0"), "the fresh HOME is empty");
        assert!(!Path::new(homes[0]).exists(), "removed after the command");
        assert!(
            c.scratch.join(".profile").exists(),
            "the shared scratch is left as it was"
        );
    }

    #[test]
    fn file_tools_round_trip() {
        let (_d, c) = ctx();
        let w = execute(
            &c,
            &req(ToolArgs::WriteFile {
                path: "reports/a.md".into(),
                content: "hello\nworld\n".into(),
            }),
        );
        assert_eq!(w.error, None, "{w:?}");
        let again = execute(
            &c,
            &req(ToolArgs::WriteFile {
                path: "reports/a.md".into(),
                content: "x".into(),
            }),
        );
        assert_eq!(again.error, Some(ErrorClass::Failed));
        let e = execute(
            &c,
            &req(ToolArgs::EditFile {
                path: "reports/a.md".into(),
                old: "world".into(),
                new: "there".into(),
            }),
        );
        assert_eq!(e.error, None);
        let r = execute(
            &c,
            &req(ToolArgs::ReadFile {
                path: "reports/a.md".into(),
                offset: Some(2),
                limit: None,
            }),
        );
        assert_eq!(r.output, "there");
        let l = execute(&c, &req(ToolArgs::ListDir { path: "reports".into() }));
        assert_eq!(l.output, "a.md");
        let g = execute(
            &c,
            &req(ToolArgs::Grep {
                pattern: "^hel".into(),
                path: ".".into(),
            }),
        );
        assert_eq!(g.output, "reports/a.md:1: hello\n");
        let n = execute(
            &c,
            &req(ToolArgs::ReadFile {
                path: "nope".into(),
                offset: None,
                limit: None,
            }),
        );
        assert_eq!(n.error, Some(ErrorClass::NotFound));
    }

    #[test]
    fn commands_are_capped_timed_and_scrubbed() {
        let (_d, c) = ctx();
        std::env::set_var("SECRET_TEST_KEY_FOR_EXEC", "sk-should-not-leak");
        let r = execute(&c, &command("env"));
        assert!(!r.output.contains("sk-should-not-leak"), "{}", r.output);
        assert!(r.output.contains("HOME="), "{}", r.output);
        let big = execute(&c, &command("yes | head -c 100000"));
        assert!(big.truncated && big.output.len() <= 1000);
        let mut slow = command("sleep 5 & sleep 5; echo done");
        slow.timeout_ms = 200;
        let t0 = Instant::now();
        let s = execute(&c, &slow);
        assert_eq!(s.error, Some(ErrorClass::Timeout));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        let f = execute(&c, &command("echo oops >&2; exit 3"));
        assert_eq!(f.error, Some(ErrorClass::Failed));
        assert!(f.output.contains("exit status 3") && f.output.contains("oops"));
    }

    #[test]
    fn a_command_whose_output_goes_elsewhere_is_still_held_to_its_deadline() {
        let (_d, c) = ctx();
        for line in ["sleep 8 >/dev/null 2>&1", "exec sleep 8 >/dev/null 2>&1"] {
            let mut quiet = command(line);
            quiet.timeout_ms = 300;
            let t0 = Instant::now();
            let r = execute(&c, &quiet);
            let took = t0.elapsed();
            assert_eq!(r.error, Some(ErrorClass::Timeout), "{line}: {}", r.output);
            assert!(
                took < Duration::from_secs(3),
                "{line}: the call outlived its deadline: {took:?}"
            );
        }
        // Closing its streams early does not cut a command short either.
        let r = execute(&c, &command("exec >/dev/null 2>&1; sleep 0.2; exit 4"));
        assert!(r.output.contains("exit status 4"), "{}", r.output);
    }

    #[test]
    fn a_process_that_left_the_group_holding_the_output_does_not_hold_the_call() {
        let (_d, c) = ctx();
        // The shell exits at once; `sleep`, in a session of its own, keeps both
        // streams open past the kill of the command's process group.
        let mut held = command("setsid sleep 8 & echo started");
        held.timeout_ms = 300;
        let t0 = Instant::now();
        let r = execute(&c, &held);
        assert_eq!(r.error, Some(ErrorClass::Timeout), "{}", r.output);
        assert!(r.output.contains("started"), "{}", r.output);
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "the call waited for the escaped process: {took:?}"
        );
    }
}
