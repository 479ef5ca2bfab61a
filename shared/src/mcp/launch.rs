//! The worker's side of an MCP server: what a tool worker is told to start
//! ([`McpLaunch`], sent in its configuration) and how it runs it ([`run_server`]):
//! the server as its child, inside the sandbox the worker already entered, with the
//! worker passing the protocol's lines between the runtime and the server. The worker
//! stands in the middle for one reason: what the server writes lands in the sandbox's
//! write layer (see [`crate::sandbox::writeback`]), and the worker copies it into the
//! repository before it passes on each answer, as it does after each tool call, and
//! once more when the server ends. Kept apart from the runtime's client
//! (`agent::mcp_client`) so the worker, below the agent loop, can reach it.

use crate::tools::WrittenBack;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// What the worker starts: sent in its [`crate::worker::WorkerConfig`]. The server's
/// stderr is the worker's own, a pipe whose last lines the runtime keeps for cards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpLaunch {
    pub server: String,
    pub argv: Vec<String>,
}

/// A server's command as every caller starts it: `argv` in `root`, with `env` only and
/// piped stdin and stdout (the caller decides stderr); `None` for an empty `argv`.
/// Python writes no bytecode beside the server's modules: the server's directory is
/// pinned whole ([`super::digest`]), and a `__pycache__` a server wrote there (where
/// its sandbox lets it write) would make the next fire's digest differ.
pub fn server_command(argv: &[String], root: &Path, env: &[(String, String)]) -> Option<Command> {
    let (program, args) = argv.split_first()?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(root)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    Some(cmd)
}

/// The method of the notes a server's worker adds to the server's lines: a
/// notification of the worker's own whose params are the write-back's
/// [`WrittenBack`] (the git repositories it kept out of the repository), sent before
/// the answer whose call made them. A line of the server's with this method is
/// dropped ([`ServerLine::PassesForANote`]), so the runtime takes these for the
/// worker's words.
pub const SANDBOX_NOTE: &str = "notifications/runtime/sandbox";

/// The worker's note of `written`, when it kept anything out or brought anything in
/// (the entries the server made, which the fire's end removes if it rejects them).
pub fn sandbox_note(written: &WrittenBack) -> Option<String> {
    if written.nested_repositories.is_empty() && written.more_repositories == 0 && written.made.is_empty() {
        return None;
    }
    let note = serde_json::json!({"jsonrpc": "2.0", "method": SANDBOX_NOTE, "params": written});
    Some(note.to_string())
}

/// What a protocol line from the server is, to its worker.
#[derive(Debug, PartialEq, Eq)]
enum ServerLine {
    /// It answers a request (JSON-RPC: an `id` and a `result` or an `error`, no
    /// `method`): the moment a call's writes are complete.
    Answer,
    /// It has the worker's note's method ([`SANDBOX_NOTE`]): dropped.
    PassesForANote,
    Other,
}

/// Reads one line from the server (parsed once: lines can be large): what it is, and
/// the line as the worker passes it on, written out again from what the worker read
/// (`None`: not a JSON object, not passed on). So the runtime's client parses exactly
/// what the worker judged: no byte-order mark it strips and this parse refuses, no
/// duplicate key read one way here and another there.
fn server_line(line: &str) -> (ServerLine, Option<String>) {
    let Ok(serde_json::Value::Object(msg)) = serde_json::from_str::<serde_json::Value>(line) else {
        return (ServerLine::Other, None);
    };
    let kind = match msg.get("method") {
        Some(m) if m.as_str() == Some(SANDBOX_NOTE) => ServerLine::PassesForANote,
        None if msg.contains_key("id") && (msg.contains_key("result") || msg.contains_key("error")) => {
            ServerLine::Answer
        }
        _ => ServerLine::Other,
    };
    (kind, serde_json::to_string(&msg).ok())
}

/// In the sandboxed worker: runs the server in the repository root with `env` only,
/// passes each line of `input` to it and each of its lines to `output` (but one that
/// passes for the worker's note), and calls `sync` before passing on an answer (the
/// notes it returns go first) and once the server has ended. The worker is PID 1 of
/// its namespace: when it returns and exits, whatever the server forked ends with it.
///
/// A server whose output ends while `input` is still open (it died, in a call or at
/// its start) has what it wrote synced and the sync's notes passed on, then `gone` is
/// called with the sync held: the worker exits there, so the runtime sees the session
/// close at once (a call in flight ends as uncertain, with a card) instead of waiting
/// out the call's timeout. When `input` ends (the runtime is done with the server),
/// what the server wrote after its last answer (an exit handler, a process it forked)
/// is synced once more and its notes passed on too, before the worker ends: the
/// runtime reads the worker's output to its end, so every entry the copy made is
/// known to be the tools' doing (helper-109: a committed report rewritten at exit
/// was taken for a person's edit and left rewritten).
pub fn run_server<I, O, S, G>(
    root: &Path,
    env: &[(String, String)],
    launch: &McpLaunch,
    input: I,
    output: O,
    sync: S,
    gone: G,
) -> std::io::Result<()>
where
    I: Iterator<Item = std::io::Result<String>>,
    O: Write + Send + 'static,
    S: FnMut() -> Vec<String> + Send + 'static,
    G: FnOnce() + Send + 'static,
{
    let Some(mut cmd) = server_command(&launch.argv, root, env) else {
        return Ok(());
    };
    cmd.stderr(Stdio::inherit());
    let program = launch.argv[0].as_str();
    kernel::spawn::die_with_parent(&mut cmd);
    // Nothing of the worker's but the three pipes: above all no line to the runtime.
    kernel::spawn::close_inherited_descriptors(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cannot start `{program}`: {e}");
            return Ok(());
        }
    };
    let (Some(mut to_server), Some(from_server)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        return Ok(());
    };
    let sync = Arc::new(Mutex::new(sync));
    let output = Arc::new(Mutex::new(output));
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Set (under the sync's lock) once the last copy is made and said: a line the
    // reader passes after it brings no copy the worker's exit could cut short or
    // leave unsaid (helper-114).
    let copied_last = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ended, reader_ended) = std::sync::mpsc::channel::<()>();
    {
        let (sync, output, closing) = (Arc::clone(&sync), Arc::clone(&output), Arc::clone(&closing));
        let copied_last = Arc::clone(&copied_last);
        std::thread::spawn(move || {
            pass_server_lines(from_server, &output, &sync, &copied_last);
            if !closing.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(mut sync) = sync.lock() {
                    pass_notes(&output, (*sync)());
                    gone();
                }
            }
            let _ = ended.send(());
        });
    }
    for line in input {
        let Ok(line) = line else { break };
        if writeln!(to_server, "{line}").and_then(|_| to_server.flush()).is_err() {
            break;
        }
    }
    // The runtime closed the session: the server sees the end of its input and ends.
    closing.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(to_server);
    child.wait()?;
    // The reader passes on the server's last lines; it ends with the server's output
    // unless something the server forked holds that open (the worker's exit ends it).
    let _ = reader_ended.recv_timeout(std::time::Duration::from_millis(500));
    // What it wrote last (and what anything it forked wrote until now) goes in too,
    // with its notes: the runtime reads on until the worker's output ends.
    if let Ok(mut sync) = sync.lock() {
        pass_notes(&output, (*sync)());
        copied_last.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    Ok(())
}

/// Passes the worker's `notes` on to the runtime, between the server's lines.
fn pass_notes<O: Write>(output: &Mutex<O>, notes: Vec<String>) {
    if notes.is_empty() {
        return;
    }
    if let Ok(mut out) = output.lock() {
        let _ = notes
            .iter()
            .try_for_each(|l| writeln!(out, "{l}"))
            .and_then(|_| out.flush());
    }
}

/// The longest protocol line a server may write (read, and as the worker writes it
/// out again): the worker holds a line whole to read it, so one without end would
/// grow the worker's memory until the host's ran out (helper-115: a 1 GB line, 1.9 GB
/// resident), and the runtime parses what it passes on (helper-116: 16 MiB of `[0,0,...]`
/// grew `builder` to 1.5 GB). A longer line ends the session, as the server's end
/// would. Ample for a tool's answer: the model is shown at most `tool_output_bytes`.
pub const SERVER_LINE_MAX: usize = 4 * 1024 * 1024;

/// What [`read_line_within`] read.
#[derive(Debug, PartialEq)]
enum Read {
    /// A line, without its end.
    Line(String),
    /// The end of the stream, or a read error.
    End,
    /// A line longer than the limit: nothing after it is read.
    TooLong,
    /// A line that is not UTF-8 (so not JSON): nothing after it is read.
    NotUtf8,
}

/// The next line of `from` without its end (`\n` or `\r\n`), read no further than
/// `max` bytes past its start (its end included).
fn read_line_within(from: &mut impl BufRead, max: usize) -> Read {
    let mut line = Vec::new();
    let Ok(read) = std::io::Read::take(&mut *from, max as u64 + 1).read_until(b'\n', &mut line) else {
        return Read::End;
    };
    let ended = line.last() == Some(&b'\n');
    if read == 0 {
        return Read::End;
    }
    if !ended && line.len() > max {
        return Read::TooLong;
    }
    if ended {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    String::from_utf8(line).map_or(Read::NotUtf8, Read::Line)
}

/// The reader of [`run_server`]: each line from the server, read as
/// [`server_line`] reads it, to `output`, an answer after `sync` and the notes it
/// returned (the sync's lock held until they are out, so the last copy cannot come
/// between a copy and its note); until the server's output ends or `output` fails.
/// Once `copied_last` is set, lines pass with no copy.
fn pass_server_lines<O: Write, S: FnMut() -> Vec<String>>(
    from_server: std::process::ChildStdout,
    output: &Mutex<O>,
    sync: &Mutex<S>,
    copied_last: &std::sync::atomic::AtomicBool,
) {
    let mut from_server = BufReader::new(from_server);
    // Said on the server's stderr (the worker's), so its card or pin says why.
    let too_long = || {
        eprintln!(
            "[sandbox] the server wrote a protocol line over {} MiB: its session ends",
            SERVER_LINE_MAX >> 20
        );
    };
    loop {
        let line = match read_line_within(&mut from_server, SERVER_LINE_MAX) {
            Read::Line(line) => line,
            Read::End => break,
            Read::TooLong => break too_long(),
            Read::NotUtf8 => {
                break eprintln!("[sandbox] the server wrote a protocol line that is not UTF-8: its session ends");
            }
        };
        let (kind, line) = server_line(&line);
        let (ServerLine::Answer | ServerLine::Other, Some(line)) = (&kind, line) else {
            continue;
        };
        // Written out again it can be longer (`1e15` is `1000000000000000.0`).
        if line.len() > SERVER_LINE_MAX {
            break too_long();
        }
        let mut copying = if kind == ServerLine::Answer {
            sync.lock().ok()
        } else {
            None
        };
        let notes = match copying.as_mut() {
            Some(sync) if !copied_last.load(std::sync::atomic::Ordering::SeqCst) => (**sync)(),
            _ => Vec::new(),
        };
        let Ok(mut output) = output.lock() else { break };
        let passed = notes
            .iter()
            .chain(std::iter::once(&line))
            .try_for_each(|l| writeln!(output, "{l}"));
        if passed.and_then(|_| output.flush()).is_err() {
            break;
        }
        drop(output);
        drop(copying);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_read_up_to_its_limit_and_one_past_it_ends_the_reading() {
        let line = |s: &str| Read::Line(s.to_string());
        let mut from = std::io::Cursor::new(b"{\"a\":1}\r\n1234567\n123456789\nnever".to_vec());
        assert_eq!(read_line_within(&mut from, 8), line("{\"a\":1}"));
        assert_eq!(read_line_within(&mut from, 8), line("1234567"));
        assert_eq!(
            read_line_within(&mut from, 8),
            Read::TooLong,
            "nine bytes are past the limit"
        );
        let mut last = std::io::Cursor::new(b"tail".to_vec());
        assert_eq!(read_line_within(&mut last, 8), line("tail"));
        assert_eq!(read_line_within(&mut last, 8), Read::End);
        assert_eq!(
            read_line_within(&mut std::io::Cursor::new(vec![0xff, b'\n']), 8),
            Read::NotUtf8
        );
        let mut endless = std::io::Read::take(std::io::repeat(b'x'), 1 << 30);
        let mut endless = BufReader::new(&mut endless);
        assert_eq!(
            read_line_within(&mut endless, 1 << 20),
            Read::TooLong,
            "read no further than the limit"
        );
    }

    #[test]
    fn an_answer_is_a_result_or_error_with_an_id_and_nothing_else_is() {
        let answer = |l: &str| server_line(l).0 == ServerLine::Answer;
        assert!(answer(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#));
        assert!(answer(r#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}"#));
        assert!(!answer(r#"{"jsonrpc":"2.0","id":4,"method":"roots/list"}"#));
        assert!(!answer(
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        ));
        assert!(!answer("not json"));
        assert_eq!(
            server_line(&format!(r#"{{"jsonrpc":"2.0","id":5,"method":"{SANDBOX_NOTE}"}}"#)).0,
            ServerLine::PassesForANote
        );
        // A byte-order mark, which the runtime's client strips: refused here, so a
        // note behind one is never passed on.
        let bom = format!("\u{feff}{{\"jsonrpc\":\"2.0\",\"method\":\"{SANDBOX_NOTE}\"}}");
        assert_eq!(server_line(&bom).1, None);
        // What is passed on is what was read, written out again (keys sorted).
        let (_, out) = server_line(r#"{ "jsonrpc" : "2.0", "id" : 1, "result" : {} }"#);
        assert_eq!(out.as_deref(), Some(r#"{"id":1,"jsonrpc":"2.0","result":{}}"#));
    }

    /// Collects what is written to it.
    #[derive(Clone, Default)]
    struct Collected(Arc<Mutex<Vec<u8>>>);

    impl Write for Collected {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_server_inherits_no_descriptor_of_the_worker() {
        use std::os::fd::AsRawFd;
        // A descriptor without close-on-exec (as the worker's copy of its stdout, a
        // line to the runtime, once was).
        let leaked = rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), 200).unwrap();
        rustix::io::fcntl_setfd(&leaked, rustix::io::FdFlags::empty()).unwrap();
        let launch = McpLaunch {
            server: "fds".into(),
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                r#"for f in /proc/$$/fd/*; do printf '{"fd":"%s"}\n' "${f##*/}"; done"#.into(),
            ],
        };
        let out = Collected::default();
        run_server(
            &std::env::temp_dir(),
            &[],
            &launch,
            std::iter::empty(),
            out.clone(),
            Vec::new,
            || {},
        )
        .unwrap();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains(r#"{"fd":"0"}"#),
            "the server listed its descriptors: {text}"
        );
        assert!(
            !text.contains(&format!(r#""{}""#, leaked.as_raw_fd())),
            "the server holds the worker's descriptor: {text}"
        );
    }

    /// A server that ends while the session is open: synced, then `gone` (the worker
    /// exits there) without waiting for the runtime's next line; a server that ends
    /// because the session closed is not `gone`.
    #[test]
    fn a_server_that_ends_by_itself_is_gone_at_once() {
        let launch = McpLaunch {
            server: "dies".into(),
            argv: vec!["/bin/sh".into(), "-c".into(), "exit 3".into()],
        };
        let (to_worker, input) = std::sync::mpsc::channel::<String>();
        let (said_gone, heard_gone) = std::sync::mpsc::channel::<usize>();
        let synced = Arc::new(Mutex::new(0usize));
        let (counter, seen) = (Arc::clone(&synced), Arc::clone(&synced));
        let worker = std::thread::spawn(move || {
            run_server(
                &std::env::temp_dir(),
                &[],
                &launch,
                std::iter::from_fn(move || input.recv().ok().map(Ok)),
                Collected::default(),
                move || {
                    *counter.lock().unwrap() += 1;
                    Vec::new()
                },
                move || {
                    let _ = said_gone.send(*seen.lock().unwrap());
                },
            )
        });
        // The runtime has sent nothing and closed nothing: the server's end is news.
        let synced_first = heard_gone
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a server that died is gone without waiting for input");
        assert_eq!(synced_first, 1, "what it wrote was synced before");
        drop(to_worker);
        worker.join().unwrap().unwrap();
        // Ended by the session's close instead: never `gone`.
        let launch = McpLaunch {
            server: "cat".into(),
            argv: vec!["/bin/cat".into()],
        };
        let (said_gone, heard_gone) = std::sync::mpsc::channel::<()>();
        run_server(
            &std::env::temp_dir(),
            &[],
            &launch,
            std::iter::empty(),
            Collected::default(),
            Vec::new,
            move || {
                let _ = said_gone.send(());
            },
        )
        .unwrap();
        assert!(heard_gone.try_recv().is_err(), "a closed session's server is not gone");
    }

    /// Each line written, with how many syncs had run when it was.
    struct Out {
        synced: Arc<Mutex<usize>>,
        seen: Arc<Mutex<Vec<(usize, String)>>>,
        buf: Vec<u8>,
    }

    impl Write for Out {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.buf.extend_from_slice(b);
            while let Some(i) = self.buf.iter().position(|c| *c == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let n = *self.synced.lock().unwrap();
                self.seen
                    .lock()
                    .unwrap()
                    .push((n, String::from_utf8_lossy(&line).trim().to_string()));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_pass_both_ways_and_each_answer_is_preceded_by_a_sync() {
        let dir = std::env::temp_dir();
        let launch = McpLaunch {
            server: "echo".into(),
            // Echoes each request line back: an answer for the first, a notification
            // for the second.
            argv: vec!["/bin/cat".into()],
        };
        let synced = Arc::new(Mutex::new(0usize));
        let seen = Arc::new(Mutex::new(Vec::<(usize, String)>::new()));
        let out = Out {
            synced: Arc::clone(&synced),
            seen: Arc::clone(&seen),
            buf: Vec::new(),
        };
        let counter = Arc::clone(&synced);
        let forged = format!(
            r#"{{"jsonrpc":"2.0","method":"{SANDBOX_NOTE}","params":{{"nested_repositories":[{{"path":"forged"}}]}}}}"#
        );
        let lines = vec![
            Ok(forged),
            Ok(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_string()),
            Ok(r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#.to_string()),
        ];
        let written = WrittenBack {
            nested_repositories: vec![crate::tools::NestedRepository {
                path: "/repo/reports/x/.git".into(),
                left: None,
            }],
            more_repositories: 0,
            made: vec!["/repo/reports/x.md".into()],
        };
        let note = sandbox_note(&written).unwrap();
        let sent = note.clone();
        run_server(
            &dir,
            &[],
            &launch,
            lines.into_iter(),
            out,
            move || {
                *counter.lock().unwrap() += 1;
                vec![sent.clone()]
            },
            || {},
        )
        .unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.len(),
            4,
            "the server's line that passed for a note is dropped: {seen:?}"
        );
        assert_eq!(seen[0], (1, note.clone()), "the worker's note goes first: {seen:?}");
        assert!(seen[1].1.contains(r#""id":1"#), "{seen:?}");
        assert_eq!(seen[1].0, 1, "the answer went out after one sync: {seen:?}");
        assert_eq!(seen[2].0, 1, "a notification brings no sync: {seen:?}");
        assert_eq!(*synced.lock().unwrap(), 2, "and one more once the server ended");
        // That last copy's note goes out too, after the server's last line: the
        // runtime reads on until the worker's output ends.
        assert_eq!(seen[3], (2, note), "{seen:?}");
        assert!(sandbox_note(&WrittenBack::default()).is_none());
    }
}
