//! A team around one bare origin, for the cron box's end-to-end tests and for the
//! team scenario test to come: the laptop (the scaffolded repository, with review
//! and sync turned on through review and pushed), the cron box (a clone of the origin
//! that fires the scaffold's `digest` task), and engineer clones made on demand, with
//! or without hooks. Every git step is the real `git` command line; every fire and
//! every builder step the real binary. Helpers name what a team does (land an
//! approved change, push past the hook, force-push) and what the tests check
//! (receipts on the origin, cards a clone sees after a pull, locks left anywhere).

use crate::review::{builder_ok, git, path_with_builder, with_origin, REVIEWER};
use crate::util::TestEnv;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The laptop, the origin and the cron box.
pub(crate) struct Team {
    pub env: TestEnv,
    pub origin: PathBuf,
    pub cron: PathBuf,
}

/// One fire of the cron box.
pub(crate) struct Fired {
    pub code: i32,
    /// The signal that ended the process, if one did.
    pub signal: Option<i32>,
    pub summary: Value,
    pub stderr: String,
}

impl std::fmt::Display for Fired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}: {}\nstderr: {}", self.code, self.summary, self.stderr)
    }
}

impl Team {
    /// The laptop turns on review and sync through review and pushes; the cron box
    /// clones the origin and installs the hooks (the approvals refspec).
    pub fn new() -> Team {
        let env = TestEnv::new();
        let origin = with_origin(&env);
        let settings = env.read("settings/runtime.yaml");
        env.write(
            "settings/runtime.yaml",
            &format!("{settings}require_reviewed: true\nsync:\n  remote: origin\n  branch: main\n"),
        );
        builder_ok(&env, &env.root, None, &["propose", "cron", "-m", "Review and sync"]);
        builder_ok(&env, &env.root, Some(REVIEWER), &["approve", "cron"]);
        builder_ok(&env, &env.root, None, &["merge", "cron"]);
        git(&env, &env.root, &["push", "-q", "origin"]);
        git(&env, &env.root, &["fetch", "-q", "origin"]);
        git(&env, &env.root, &["branch", "-q", "--set-upstream-to=origin/main"]);
        let cron = env.home.join("cron");
        git(
            &env,
            &env.home,
            &["clone", "-q", origin.to_str().unwrap(), cron.to_str().unwrap()],
        );
        builder_ok(&env, &cron, None, &["install-hooks"]);
        // `git gc --auto` in the foreground, as in every test repository (`TestEnv::new`):
        // each fire's sync pushes a pack into the origin, and a detached repack started
        // by the next push could still be deleting packs under a fetch or a final fsck.
        for repo in [&origin, &cron] {
            git(&env, repo, &["config", "gc.autoDetach", "false"]);
        }
        Team { env, origin, cron }
    }

    pub fn laptop(&self) -> &Path {
        &self.env.root
    }

    /// Another engineer's clone of the origin (`hooks`: with `builder install-hooks`).
    pub fn clone_as(&self, name: &str, hooks: bool) -> PathBuf {
        let dir = self.env.home.join(name);
        self.git(
            &self.env.home,
            &["clone", "-q", self.origin.to_str().unwrap(), dir.to_str().unwrap()],
        );
        self.git(&dir, &["config", "gc.autoDetach", "false"]);
        if hooks {
            builder_ok(&self.env, &dir, None, &["install-hooks"]);
        }
        dir
    }

    /// `git` in `dir`, which must succeed: its stdout, trimmed.
    pub fn git(&self, dir: &Path, args: &[&str]) -> String {
        git(&self.env, dir, args)
    }

    /// `git` in `dir`, whatever it says.
    pub fn try_git(&self, dir: &Path, args: &[&str]) -> Output {
        self.env.git_with_path(dir, &path_with_builder(), args)
    }

    pub fn rev(&self, dir: &Path, what: &str) -> String {
        self.git(dir, &["rev-parse", what])
    }

    pub fn origin_tip(&self) -> String {
        self.rev(&self.origin, "refs/heads/main")
    }

    pub fn is_ancestor(&self, dir: &Path, a: &str, b: &str) -> bool {
        self.try_git(dir, &["merge-base", "--is-ancestor", a, b])
            .status
            .success()
    }

    /// `runtime fire digest --json` on the cron box.
    pub fn fire(&self) -> Fired {
        self.fire_with(&[], &[])
    }

    /// A fire with variables set (`set`) and removed (`unset`) on the child only.
    pub fn fire_with(&self, set: &[(&str, &str)], unset: &[&str]) -> Fired {
        let mut c = self.env.command(
            "runtime",
            &["fire", "digest", "--json", "-C", self.cron.to_str().unwrap()],
        );
        for (k, v) in set {
            c.env(k, v);
        }
        for k in unset {
            c.env_remove(k);
        }
        Fired::of(c.output().expect("run runtime"))
    }

    /// `runtime check` on the cron box: (exit code, stdout).
    pub fn check(&self, set: &[(&str, &str)]) -> (i32, String) {
        let mut c = self
            .env
            .command("runtime", &["check", "-C", self.cron.to_str().unwrap()]);
        for (k, v) in set {
            c.env(k, v);
        }
        let out = c.output().expect("run runtime check");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// On the laptop: brings it to the origin's tip (a fast-forward or a merge, as
    /// `git pull` does).
    /// A fire while the origin cannot be reached (moved away, then back): it fails,
    /// and its records stay on the box, unpushed.
    pub fn fire_offline(&self) -> Fired {
        let away = self.origin.with_extension("away");
        std::fs::rename(&self.origin, &away).unwrap();
        let offline = self.fire();
        std::fs::rename(&away, &self.origin).unwrap();
        assert_ne!(offline.code, 0, "the origin was away: {offline}");
        offline
    }

    pub fn pull(&self) {
        self.git(self.laptop(), &["pull", "-q", "--no-rebase", "--no-edit"]);
    }

    /// On the laptop: commits `files` and pushes them (past the hook with
    /// `no_verify`). Returns the commit.
    pub fn push_files(&self, files: &[(&str, &str)], msg: &str, no_verify: bool) -> String {
        self.pull();
        for (rel, body) in files {
            self.env.write(rel, body);
            self.git(self.laptop(), &["add", rel]);
        }
        self.git(self.laptop(), &["commit", "-qm", msg]);
        let mut args = vec!["push", "-q"];
        if no_verify {
            args.push("--no-verify");
        }
        args.extend(["origin", "main"]);
        self.git(self.laptop(), &args);
        self.rev(self.laptop(), "HEAD")
    }

    /// The settings as the laptop has them, with `runtime_identity.signing_key`
    /// naming `key` (the runtime's identity otherwise the scaffold's).
    pub fn settings_signing_with(&self, key: &Path) -> String {
        let settings = self.env.read("settings/runtime.yaml");
        let line = format!(
            "runtime_identity: {{ name: runtime, email: runtime@localhost, signing_key: {} }}",
            key.display()
        );
        let out: Vec<String> = settings
            .lines()
            .map(|l| match l.starts_with("runtime_identity:") {
                true => line.clone(),
                false => l.to_string(),
            })
            .collect();
        assert!(
            out.contains(&line),
            "no runtime_identity line in the settings:\n{settings}"
        );
        out.join("\n") + "\n"
    }

    /// Lands the runtime signing with `key`, whose allowed-signers line (for
    /// `runtime@localhost`, namespace `builder-runtime`) is the only one. Returns the
    /// merge commit.
    pub fn land_signing_key(&self, name: &str, key: &Path, public: &str) -> String {
        self.pull();
        let settings = self.settings_signing_with(key);
        let signers = format!("runtime@localhost namespaces=\"builder-runtime\" {public}");
        self.land(
            name,
            &[
                ("settings/runtime.yaml", settings.as_str()),
                ("settings/allowed_signers", signers.as_str()),
            ],
        )
    }

    /// On the laptop: proposes, approves (as the reviewer), merges and pushes a
    /// change to builder-owned `files`. Returns the merge commit.
    pub fn land(&self, name: &str, files: &[(&str, &str)]) -> String {
        self.pull();
        for (rel, body) in files {
            self.env.write(rel, body);
        }
        builder_ok(&self.env, self.laptop(), None, &["propose", name]);
        builder_ok(&self.env, self.laptop(), Some(REVIEWER), &["approve", name]);
        builder_ok(&self.env, self.laptop(), None, &["merge", name]);
        self.git(self.laptop(), &["push", "-q", "origin", "main"]);
        self.git(
            self.laptop(),
            &["push", "-q", "origin", "refs/builder/*:refs/builder/*"],
        );
        self.rev(self.laptop(), "HEAD")
    }

    /// Every file under `runs/`, `cards/` and `reports/` in the cron box's work tree.
    pub fn box_records(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack: Vec<PathBuf> = ["runs", "cards", "reports"].iter().map(|d| self.cron.join(d)).collect();
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p.strip_prefix(&self.cron).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        out.sort();
        out
    }

    /// Every receipt in the cron box's work tree: (path, the commit it fired on).
    pub fn receipts(&self) -> Vec<(String, String)> {
        self.box_records()
            .into_iter()
            .filter(|p| p.starts_with("runs/") && p.ends_with(".json"))
            .filter_map(|p| {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(self.cron.join(&p)).ok()?).ok()?;
                Some((p, v["inputs"]["commit"].as_str()?.to_string()))
            })
            .collect()
    }

    /// The files of the origin's tip.
    pub fn origin_files(&self) -> Vec<String> {
        self.git(&self.origin, &["ls-tree", "-r", "--name-only", "refs/heads/main"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every record the box has is in the origin's tip.
    pub fn assert_records_on_origin(&self) {
        let files = self.origin_files();
        let records = self.box_records();
        assert!(!records.is_empty());
        for r in records {
            assert!(files.contains(&r), "{r} is not on the origin");
        }
    }

    /// As [`Team::assert_records_on_origin`], and every receipt names a commit in
    /// the origin's history.
    pub fn assert_receipts_hold(&self) {
        self.assert_records_on_origin();
        let tip = self.origin_tip();
        for (path, commit) in self.receipts() {
            assert!(
                self.is_ancestor(&self.origin, &commit, &tip),
                "receipt {path} names {commit}, not in the origin's history:\norigin:\n{}\nbox:\n{}",
                self.git(
                    &self.origin,
                    &["log", "--graph", "--format=%h %an %s", "refs/heads/main"]
                ),
                self.git(&self.cron, &["log", "--graph", "--all", "--format=%h %an %s %d"])
            );
        }
    }

    /// The kinds of the cards a fire wrote.
    pub fn card_kinds(&self, fired: &Fired) -> Vec<String> {
        crate::cron_box::env_cards(&self.cron, &fired.summary)
    }

    /// The card files a fire wrote, parsed.
    pub fn cards_of(&self, fired: &Fired) -> Vec<serde_yaml::Value> {
        let mut out = Vec::new();
        for id in fired.summary["cards"].as_array().into_iter().flatten() {
            let id = id.as_str().unwrap();
            let file = std::fs::read_dir(self.cron.join("cards"))
                .unwrap()
                .flatten()
                .map(|d| d.path().join(format!("{id}.yaml")))
                .find(|p| p.is_file())
                .unwrap_or_else(|| panic!("card {id} not found"));
            out.push(serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap());
        }
        out
    }

    /// `builder cards list --json` in `dir`.
    pub fn cards_listed(&self, dir: &Path) -> Vec<Value> {
        let out = builder_ok(&self.env, dir, None, &["cards", "list", "--json"]);
        match serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}")) {
            Value::Array(v) => v,
            other => other["groups"].as_array().cloned().unwrap_or_default(),
        }
    }

    /// Every `*.lock` file under `dir` (a git directory: the origin, `.git`).
    pub fn locks_under(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "lock") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// No git lock in the origin or the cron box's git directory, and both pass
    /// `git fsck`.
    pub fn assert_no_lock_and_fsck_clean(&self) {
        let left: Vec<PathBuf> = Team::locks_under(&self.origin)
            .into_iter()
            .chain(Team::locks_under(&self.cron.join(".git")))
            .collect();
        assert!(left.is_empty(), "locks left: {left:?}");
        for dir in [&self.origin, &self.cron] {
            let out = self.try_git(dir, &["fsck", "--no-progress"]);
            assert!(
                out.status.success(),
                "fsck in {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Fired {
    fn of(out: Output) -> Fired {
        use std::os::unix::process::ExitStatusExt;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let summary = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        Fired {
            code: out.status.code().unwrap_or(-1),
            signal: out.status.signal(),
            summary,
            stderr,
        }
    }

    /// Whether the process was killed by SIGKILL (a crash point).
    pub fn killed(&self) -> bool {
        self.signal == Some(libc::SIGKILL)
    }

    pub fn cards(&self) -> usize {
        self.summary["cards"].as_array().map_or(0, Vec::len)
    }
}
