//! Test harness: a temporary agent repo with its own HOME and git config, helpers to
//! run the binaries with variables set on the child only, and a scripted model server
//! (tiny_http on 127.0.0.1) that speaks the OpenAI or Anthropic wire format.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const TEST_KEY: &str = "sk-test-SUPERSECRETVALUE-1234567890";
pub const KEY_ENV: &str = "E2E_PROVIDER_KEY";

/// Path of a workspace binary built next to this test binary.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is not built; run `cargo build --workspace` before the tests",
        p.display()
    );
    p
}

/// The trimmed stdout of `git args` run in `dir`, which must have succeeded (the
/// failure names the command, the directory and what git said).
pub fn succeeded(out: Output, dir: &Path, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A temporary agent repository.
pub struct TestEnv {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub home: PathBuf,
}

impl TestEnv {
    /// A scaffolded and committed agent repo.
    pub fn new() -> TestEnv {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("repo");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let env = TestEnv { root, home, _dir: dir };
        let out = env.builder(&["init", env.root.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Long races write enough loose objects for `git gc --auto` (from an engineer's
        // git command or the runtime's records commit). Detached, as git runs it by
        // default, it would still be packing and deleting loose objects when a test's
        // final `git fsck` lists them ("unable to mmap ... No such file"): in the
        // foreground it is over when the command that started it is.
        env.git_ok(&env.root, &["config", "gc.autoDetach", "false"]);
        env.commit_all("scaffold");
        env
    }

    /// `program` with none of the caller's environment but `PATH`: this env's HOME
    /// and no system or global git configuration, so no identity either (what a new
    /// user's shell has).
    pub fn isolated_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .env("HOME", &self.home)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1");
        c
    }

    /// [`TestEnv::isolated_command`] as the engineer (`Eng <eng@example.com>`): every
    /// process a test starts begins here.
    pub fn clean_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.isolated_command(program);
        c.env("GIT_AUTHOR_NAME", "Eng")
            .env("GIT_AUTHOR_EMAIL", "eng@example.com")
            .env("GIT_COMMITTER_NAME", "Eng")
            .env("GIT_COMMITTER_EMAIL", "eng@example.com");
        c
    }

    /// A workspace binary with the test's environment and the provider key, in the
    /// repository (or HOME before it exists).
    pub fn command(&self, bin_name: &str, args: &[&str]) -> Command {
        let mut c = self.clean_command(bin(bin_name));
        c.args(args)
            .current_dir(if self.root.exists() { &self.root } else { &self.home })
            .env(KEY_ENV, TEST_KEY);
        c
    }

    /// `git args` in `dir` as the engineer, not run yet.
    fn git_command(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = self.clean_command("git");
        c.args(args).current_dir(dir);
        c
    }

    /// `git args` in `dir` as the engineer with `path` as `PATH` (a hook may need
    /// `builder` on it), whatever it says.
    pub fn git_with_path(&self, dir: &Path, path: &str, args: &[&str]) -> Output {
        self.git_command(dir, args).env("PATH", path).output().expect("run git")
    }

    /// `git args` in `dir` as the engineer, whatever it says.
    pub fn git_in(&self, dir: &Path, args: &[&str]) -> Output {
        self.git_command(dir, args).output().expect("run git")
    }

    /// `git args` in `dir` as the engineer, which must succeed: its stdout, trimmed.
    pub fn git_ok(&self, dir: &Path, args: &[&str]) -> String {
        succeeded(self.git_in(dir, args), dir, args)
    }

    pub fn builder(&self, args: &[&str]) -> Output {
        self.command("builder", args).output().expect("run builder")
    }

    pub fn runtime(&self, args: &[&str]) -> Output {
        self.command("runtime", args).output().expect("run runtime")
    }

    /// `runtime fire <task> --json`: (exit code, summary JSON, stderr).
    pub fn fire(&self, task: &str) -> (i32, Value, String) {
        let out = self.runtime(&["fire", task, "--json"]);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let summary = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("fire printed no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}"));
        (out.status.code().unwrap_or(-1), summary, stderr)
    }

    /// The exit code of a fire that completed with `summary`: 0 with no card, 5
    /// ("needs attention") when it wrote cards.
    pub fn completed_code(summary: &Value) -> i32 {
        if summary["cards"].as_array().is_some_and(|c| !c.is_empty()) {
            5
        } else {
            0
        }
    }

    pub fn write(&self, rel: &str, body: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Stages everything and commits as the engineer.
    pub fn commit_all(&self, msg: &str) {
        let repo = git2::Repository::open(&self.root).unwrap();
        let mut idx = repo.index().unwrap();
        idx.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
        idx.update_all(["*"], None).unwrap();
        idx.write().unwrap();
        let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("Eng", "eng@example.com").unwrap();
        let parents: Vec<git2::Commit> = repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_commit().ok())
            .into_iter()
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, msg, &tree, &refs).unwrap();
    }

    /// Hashes of every file outside runtime-owned paths, `.runtime/` and `.git/`.
    pub fn builder_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut out, &|rel| {
            let first = rel.split('/').next().unwrap_or("");
            !matches!(first, "reports" | "cards" | "runs" | ".runtime" | ".git")
        });
        out
    }

    /// Hashes of `.git` config and hooks (the places an escape would write).
    pub fn git_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let git = self.root.join(".git");
        walk(&git, &git, &mut out, &|rel| {
            rel == "config" || rel.starts_with("hooks") || rel == "HEAD" || rel.starts_with("info")
        });
        out
    }

    /// The id of HEAD's commit.
    pub fn head_id(&self) -> String {
        let repo = git2::Repository::open(&self.root).unwrap();
        let id = repo.head().unwrap().peel_to_commit().unwrap().id();
        id.to_string()
    }

    /// Authors of every commit on HEAD, newest first.
    pub fn commit_authors(&self) -> Vec<String> {
        let repo = git2::Repository::open(&self.root).unwrap();
        let mut walk = repo.revwalk().unwrap();
        walk.push_head().unwrap();
        walk.map(|oid| {
            repo.find_commit(oid.unwrap())
                .unwrap()
                .author()
                .name()
                .unwrap_or("")
                .to_string()
        })
        .collect()
    }

    /// Paths changed by the newest commit.
    pub fn last_commit_paths(&self) -> Vec<String> {
        let repo = git2::Repository::open(&self.root).unwrap();
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let parent = head.parent(0).ok().map(|p| p.tree().unwrap());
        let diff = repo
            .diff_tree_to_tree(parent.as_ref(), Some(&head.tree().unwrap()), None)
            .unwrap();
        diff.deltas()
            .map(|d| d.new_file().path().unwrap().to_string_lossy().to_string())
            .collect()
    }

    pub fn receipt(&self, summary: &Value) -> Value {
        let rel = summary["receipt"].as_str().expect("receipt path");
        serde_json::from_str(&self.read(rel)).unwrap()
    }

    pub fn cards(&self, summary: &Value) -> Vec<serde_yaml::Value> {
        let ids: Vec<String> = summary["cards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let mut found = None;
            for day in std::fs::read_dir(self.root.join("cards")).unwrap().flatten() {
                let p = day.path().join(format!("{id}.yaml"));
                if p.exists() {
                    found = Some(serde_yaml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap());
                }
            }
            out.push(found.unwrap_or_else(|| panic!("card {id} not found")));
        }
        out
    }

    pub fn card_kinds(&self, summary: &Value) -> Vec<String> {
        self.cards(summary)
            .iter()
            .map(|c| c["kind"].as_str().unwrap().to_string())
            .collect()
    }

    /// Every byte the runtime wrote where a secret could end up.
    pub fn all_record_text(&self) -> String {
        let mut out = String::new();
        for d in ["reports", "cards", "runs"] {
            let mut m = BTreeMap::new();
            let base = self.root.join(d);
            collect_text(&base, &mut m);
            for v in m.values() {
                out.push_str(v);
            }
        }
        if let Ok(b) = std::fs::read(self.root.join(".runtime/state.db")) {
            out.push_str(&String::from_utf8_lossy(&b));
        }
        out
    }
}

fn collect_text(dir: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_text(&p, out);
        } else if let Ok(s) = std::fs::read(&p) {
            out.insert(p.display().to_string(), String::from_utf8_lossy(&s).to_string());
        }
    }
}

fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>, keep: &dyn Fn(&str) -> bool) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(base).unwrap().to_string_lossy().to_string();
        if !keep(&rel) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.insert(format!("{rel}/"), "dir".into());
            walk(base, &p, out, keep);
        } else if meta.file_type().is_symlink() {
            out.insert(rel, format!("link:{}", std::fs::read_link(&p).unwrap().display()));
        } else {
            let bytes = std::fs::read(&p).unwrap_or_default();
            out.insert(
                rel,
                format!(
                    "{}:{:o}",
                    hex::encode(Sha256::digest(&bytes)),
                    std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
                ),
            );
        }
    }
}

/// Which wire format the scripted server speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wire {
    OpenAi,
    Anthropic,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
}

impl Reply {
    pub fn json(v: Value) -> Reply {
        Reply {
            status: 200,
            body: v.to_string(),
            headers: vec![],
            delay: Duration::ZERO,
        }
    }
    pub fn status(code: u16, body: &str) -> Reply {
        Reply {
            status: code,
            body: body.into(),
            headers: vec![],
            delay: Duration::ZERO,
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn delayed(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

/// A tool call in a scripted turn: (id, name, raw argument text).
pub type Call<'a> = (&'a str, &'a str, &'a str);

/// A model answer in the wire format: text and/or tool calls, with usage.
pub fn turn(wire: Wire, text: Option<&str>, calls: &[Call], usage: (u64, u64)) -> Reply {
    Reply::json(match wire {
        Wire::OpenAi => {
            let mut msg = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = calls.iter().map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})).collect();
            }
            json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "test-model", "choices": [{"index": 0, "message": msg, "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}], "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1}})
        }
        Wire::Anthropic => {
            let mut content = Vec::new();
            if let Some(t) = text {
                content.push(json!({"type": "text", "text": t}));
            }
            for (id, name, args) in calls {
                let input: Value = serde_json::from_str(args).unwrap_or(json!({}));
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "test-model", "content": content, "stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" }, "usage": {"input_tokens": usage.0, "output_tokens": usage.1}})
        }
    })
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When the request's body had been read (read by `benches/mcp_start.rs`, which
    /// includes this file; no e2e test times requests).
    #[allow(dead_code)]
    pub at: std::time::Instant,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

/// The scripted model server. Replies are served in order; past the end it answers 500.
pub struct ModelServer {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// What `GET /props` answers (llama.cpp's server properties); 404 when unset.
    /// Such GETs neither consume a scripted reply nor count as requests.
    pub props: Arc<Mutex<Option<Value>>>,
    /// The paths of the GETs the server was asked (`/props`, `/v1/models`), in order.
    pub gets: Arc<Mutex<Vec<String>>>,
    server: Arc<tiny_http::Server>,
}

impl ModelServer {
    pub fn start(replies: Vec<Reply>) -> ModelServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1"));
        let port = server.server_addr().to_ip().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let props: Arc<Mutex<Option<Value>>> = Arc::new(Mutex::new(None));
        let props2 = props.clone();
        let gets: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let gets2 = gets.clone();
        let queue = Arc::new(Mutex::new(
            replies.into_iter().collect::<std::collections::VecDeque<_>>(),
        ));
        let (srv, seen2) = (server.clone(), seen.clone());
        std::thread::spawn(move || {
            for mut req in srv.incoming_requests() {
                if *req.method() == tiny_http::Method::Get {
                    gets2.lock().unwrap().push(req.url().to_string());
                    let answer = match (req.url().ends_with("/props"), props2.lock().unwrap().clone()) {
                        (true, Some(v)) => tiny_http::Response::from_string(v.to_string()).with_status_code(200),
                        _ => tiny_http::Response::from_string("{}").with_status_code(404),
                    };
                    let _ = req.respond(answer);
                    continue;
                }
                let mut body = String::new();
                let _ = req.as_reader().read_to_string(&mut body);
                seen2.lock().unwrap().push(Seen {
                    at: std::time::Instant::now(),
                    path: req.url().to_string(),
                    headers: req
                        .headers()
                        .iter()
                        .map(|h| (h.field.as_str().to_string().to_ascii_lowercase(), h.value.to_string()))
                        .collect(),
                    body: serde_json::from_str(&body).unwrap_or(Value::Null),
                });
                let reply = queue
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or_else(|| Reply::status(500, "{\"error\":\"script exhausted\"}"));
                std::thread::spawn(move || {
                    std::thread::sleep(reply.delay);
                    let mut resp = tiny_http::Response::from_string(reply.body)
                        .with_status_code(reply.status)
                        .with_header(tiny_http::Header::from_bytes("content-type", "application/json").unwrap());
                    for (k, v) in reply.headers {
                        resp.add_header(tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap());
                    }
                    let _ = req.respond(resp);
                });
            }
        });
        ModelServer {
            port,
            seen,
            props,
            gets,
            server,
        }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Provider settings YAML for this server.
    pub fn provider_yaml(&self, wire: Wire) -> String {
        match wire {
            Wire::OpenAi => format!("provider:\n  kind: openai\n  base_url: http://127.0.0.1:{}/v1\n  model: test-model\n  api_key_env: {KEY_ENV}\n", self.port),
            Wire::Anthropic => format!("provider:\n  kind: anthropic\n  base_url: http://127.0.0.1:{}\n  model: test-model\n  api_key_env: {KEY_ENV}\n", self.port),
        }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

/// Settings for a test: the given provider block, permissive-enough rules, fast retries.
pub fn settings_yaml(provider: &str, extra: &str) -> String {
    format!(
        "version: 1\n{provider}permissions:\n  allow: [\"Read(**)\", \"Bash(git log*)\", \"Bash(ls*)\", \"Bash(cat*)\", \"Bash(echo*)\", \"Bash(sleep*)\"]\n  deny: [\"Bash(rm -rf*)\", \"Bash(git push*)\"]\n  write: [\"reports/**\"]\nsandbox:\n  landlock: required\nprices:\n  test-model: {{input_per_mtok: 1000.0, output_per_mtok: 2000.0}}\n{extra}"
    )
}

/// A task prompt without prefetch or acceptance checks.
pub const PLAIN_PROMPT: &str = "---\ndescription: test task\n---\nDo the test task.\n";
