//! Step 5 of a fire: the runtime restricts itself with Landlock, starts the sandboxed
//! tool worker and the providers, runs the loop, then the acceptance checks (inside
//! the worker too: they read what the model wrote). A phase that cannot go on records
//! an [`Abort`] for [`FireRun::finish`] instead of ending the fire itself.

use super::config::ACCEPTANCE_OUTPUT_BYTES;
use super::prefetch::shell_quote;
use super::{Abort, Aborted, FireEnd, FireRun};
use crate::agent::worker_client::{spawn_parked, spawn_process, WorkerClient, WorkerError};
use crate::agent::{Agent, CallDecision, CardDraft, LoopConfig};
use crate::progress::Event;
use crate::provider::{Provider, ProviderChain, ProviderError};
use crate::records::{AcceptanceRecord, CardKind};
use crate::sandbox::namespaces::{MaskSource, NamespacePlan};
use crate::sandbox::{self, landlock};
use crate::state::StateDb;
use crate::tools::exec::ExecContext;
use crate::tools::{ToolArgs, ToolRequest};
use crate::trace::{SpanKind, SpanStatus};
use crate::worker::WorkerConfig;

impl FireRun {
    /// Step 5a: restrict this process (no threads may exist yet): writes only to its
    /// records, state and git objects; TCP only to the providers and the OTLP
    /// endpoint. On `Err` the fire cannot go on; [`FireRun::finish`] records why.
    #[tracing::instrument(level = "debug", skip_all)]
    pub fn enter_sandbox(&mut self) -> Result<(), Aborted> {
        let mut git_dirs = crate::git::git_dirs(&self.repo);
        // A local sync remote: the push writes there (no port is granted for it).
        git_dirs.extend(crate::sync::sandbox_dirs(
            &self.repo,
            self.config.settings.sync.as_ref(),
        ));
        // A network sync remote: the push connects to its port (and no directory).
        let mut ports = self.config.connect_ports();
        ports.extend(crate::sync::sandbox_ports(
            &self.repo,
            self.config.settings.sync.as_ref(),
        ));
        ports.sort_unstable();
        ports.dedup();
        let spec = sandbox::runtime_spec(&self.ctx.opts.root, &git_dirs, &ports);
        let (exe, args) = &self.ctx.opts.worker_cmd;
        let env = ExecContext::scrubbed_env(&self.config.scratch);
        if self.worker.is_none() {
            match spawn_process(exe, args, &env) {
                Ok(child) => self.worker = Some(WorkerProcess::new(child)),
                Err(e) => {
                    return Err(self.abort(
                        FireEnd::Failed,
                        CardKind::SandboxUnavailable,
                        "the tool worker could not be started".into(),
                        e.to_string(),
                    ))
                }
            }
        }
        // The spare replaces a worker that dies; without one the fire still runs.
        let early = self.worker.as_mut().and_then(WorkerProcess::join_spare);
        match early.unwrap_or_else(|| spawn_parked(exe, args, &env)) {
            Ok(child) => self.spare_worker = Some(child),
            Err(e) => tracing::warn!(error = %e, "no spare tool worker"),
        }
        self.spawn_mcp_workers(&env);
        // Every thread the preparation started has ended (the spare's was joined):
        // Landlock restricts the calling thread and those it starts, not the others.
        debug_assert_eq!(
            std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count),
            1,
            "a thread runs on as the runtime restricts itself"
        );
        let entered = sandbox::prepare_dirs(&spec, &self.ctx.opts.root)
            .map_err(|e| e.to_string())
            .and_then(|_| landlock::enforce(&spec, self.config.settings.sandbox.landlock).map_err(|e| e.to_string()));
        match entered {
            Ok(record) => {
                self.sandbox = record;
                Ok(())
            }
            Err(why) => Err(self.abort(
                FireEnd::Failed,
                CardKind::SandboxUnavailable,
                "the sandbox could not be entered".into(),
                why,
            )),
        }
    }

    pub(super) fn abort(&mut self, end: FireEnd, kind: CardKind, summary: String, detail: String) -> Aborted {
        self.abort = Some(Abort {
            end,
            card: CardDraft {
                kind,
                summary,
                detail,
                evidence: vec![format!("kernel Landlock ABI {}", landlock::kernel_abi())],
            },
        });
        Aborted
    }

    /// Step 5b: start the sandboxed tool worker and run the loop, then the acceptance
    /// checks. `cancel` turns true on SIGINT/SIGTERM.
    pub async fn run(&mut self, mut cancel: tokio::sync::watch::Receiver<bool>) -> Result<(), Aborted> {
        if self.stop == crate::records::StopReason::Cancelled || crate::cancel::requested() {
            self.stop = crate::records::StopReason::Cancelled;
            return Ok(());
        }
        let mut worker = self.start_worker().await?;
        let mcp = match self.start_mcp().await {
            Ok(hub) => hub,
            Err(aborted) => {
                worker.shutdown().await;
                return Err(aborted);
            }
        };
        let mut chain = match self.providers() {
            Ok(chain) => chain,
            Err(e) => {
                worker.shutdown().await;
                let detail = self.config.redactor.redact(&e.to_string()).into_owned();
                return Err(self.abort(
                    FireEnd::InvalidInput,
                    CardKind::InvalidConfig,
                    "provider could not be set up".into(),
                    detail,
                ));
            }
        };
        chain
            .primary
            .learn_context(&self.ctx.opts.root.join(crate::layout::STATE_DIR))
            .await;
        let cfg = self.loop_config(&chain);
        self.inputs.model = cfg.model.clone();
        self.stop = Agent {
            cfg: &cfg,
            provider: &chain,
            policy: &self.config.policy,
            worker: &mut worker,
            cancel: &mut cancel,
            started: self.ctx.started,
            progress: &*self.ctx.opts.progress,
            journal: self.journal.as_mut(),
            mcp: &mcp,
            sweep: crate::agent::SweepWindow::opening_now(),
        }
        .run(&mut self.state)
        .await;
        if self.ctx.opts.resume.is_none() {
            if let Err(aborted) = self.worker_ready(&mut worker).await {
                worker.shutdown().await;
                mcp.shutdown().await;
                return Err(aborted);
            }
        }
        if let Some(why) = worker.lost() {
            // The calls after it failed unrun, and the model may have finished all the
            // same: the card says why (helper-98: the fire completed on no card).
            self.state.cards.push(CardDraft {
                kind: CardKind::SandboxUnavailable,
                summary: "the tool worker died and no spare took its place: later calls did not run".into(),
                detail: format!(
                    "{why}. Each call after it ended FAILED (\"no tool worker is left\"); the receipt lists them. A worker dies to the OOM killer or a signal: see the system log."
                ),
                evidence: vec!["the tool worker and its spare are gone".into()],
            });
        }
        if self.stop == crate::records::StopReason::FinalAnswer {
            self.acceptance = self.run_acceptance(&mut worker, &mut cancel).await;
        }
        worker.shutdown().await;
        self.state.cards.extend(mcp.list_changes());
        mcp.finish(&self.ctx.opts.root, &mut self.state).await;
        tracing::debug!(
            elapsed_ms = self.ctx.started.elapsed().as_millis() as u64,
            steps = self.state.step,
            "loop finished"
        );
        Ok(())
    }

    /// Starts the tool worker in its own sandbox; the receipt records that sandbox.
    /// A worker sent its configuration in the preparation is adopted as it is.
    #[tracing::instrument(level = "debug", skip_all)]
    async fn start_worker(&mut self) -> Result<WorkerClient, Aborted> {
        let (early, sent) = self.worker.take().map_or((None, None), WorkerProcess::adopt);
        let (child, setup, sent) = match (early, sent) {
            (Some(child), Some(setup)) => (Ok(child), setup, true),
            (early, _) => {
                let setup = WorkerSetup::new(&self.ctx.opts.root, &self.repo, &self.config);
                let child = match early {
                    Some(child) => Ok(child),
                    None => {
                        let (exe, args) = &self.ctx.opts.worker_cmd;
                        spawn_process(exe, args, &setup.config.env)
                    }
                };
                (child, setup, false)
            }
        };
        // The masks, walked now while the worker builds its root and the first model
        // request goes out ([`super::masks`]). (The spare walks for itself, if it is
        // ever woken.)
        let (masks, walk) = super::masks::masks(&self.ctx.opts.root, setup.walk);
        self.mask_walk = walk;
        let config = setup.config;
        let started = match child {
            Ok(child) if sent => WorkerClient::configured_with_masks(child, masks),
            Ok(child) => WorkerClient::start_with_masks(child, &config, masks).await,
            Err(e) => Err(WorkerError::Spawn(e)),
        };
        let mut worker = match started {
            Ok(w) => w,
            Err(e) => {
                return Err(self.abort(
                    FireEnd::Failed,
                    CardKind::SandboxUnavailable,
                    "the tool worker could not enter its sandbox".into(),
                    e.to_string(),
                ))
            }
        };
        if let Some(spare) = self.spare_worker.take() {
            worker.keep_spare(
                spare,
                WorkerConfig {
                    isolation: Some(setup.spare),
                    ..config
                },
            );
        }
        // A resumed run settles its calls before any model request: it waits now.
        if self.ctx.opts.resume.is_some() {
            if let Err(aborted) = self.worker_ready(&mut worker).await {
                worker.shutdown().await;
                return Err(aborted);
            }
        }
        Ok(worker)
    }

    /// Waits for the tool worker's sandbox report, once (a fresh fire's worker enters
    /// its sandbox while the first model request is out; the loop waits for it before
    /// any call runs): the receipt records that sandbox. A worker that could not enter
    /// it aborts the fire, after a model request that was already out (no tool ran).
    async fn worker_ready(&mut self, worker: &mut WorkerClient) -> Result<(), Aborted> {
        let sandbox = match worker.ready().await {
            Ok(sandbox) => sandbox.clone(),
            Err(why) => {
                return Err(self.abort(
                    FireEnd::Failed,
                    CardKind::SandboxUnavailable,
                    "the tool worker could not enter its sandbox".into(),
                    why,
                ))
            }
        };
        tracing::debug!(
            elapsed_ms = self.ctx.started.elapsed().as_millis() as u64,
            "tool worker sandboxed and ready"
        );
        let runtime_sandbox = std::mem::replace(&mut self.sandbox, sandbox);
        if runtime_sandbox.landlock != self.sandbox.landlock {
            self.sandbox
                .rights
                .push(format!("runtime process: {}", runtime_sandbox.landlock));
        }
        Ok(())
    }

    pub(super) fn providers(&self) -> Result<ProviderChain, ProviderError> {
        let s = &self.config.settings;
        let primary = Provider::with_replay(&s.provider, self.config.retry, |rel| self.committed_trace(rel))?;
        let fallback = s
            .fallback
            .as_ref()
            .map(|f| Provider::with_replay(f, self.config.retry, |rel| self.committed_trace(rel)))
            .transpose()?;
        let cooldown = std::time::Duration::from_secs(self.config.limits.fallback_cooldown_s);
        Ok(ProviderChain::new(primary, fallback, cooldown))
    }

    /// A replay trace the settings name (builder-owned, under `evals/`) as the fired
    /// commit holds it, as every file the approval covers. The file given with
    /// `--replay` (the operator's, or an eval case's) is read as a file, and so is
    /// the trace of a fire with no commit (a repository before its first).
    fn committed_trace(&self, rel: &str) -> Result<crate::provider::Replay, ProviderError> {
        let root = &self.ctx.opts.root;
        let commit = self.inputs.commit.as_deref().and_then(|c| git2::Oid::from_str(c).ok());
        let Some(commit) = commit.filter(|_| self.ctx.opts.replay.is_none()) else {
            return crate::provider::Replay::load(root, &root.join(rel));
        };
        let config = |m: String| ProviderError::new(crate::provider::ProviderErrorKind::Config, None, m);
        let committed = crate::review::committed::Committed::at(&self.repo, commit)
            .map_err(|e| config(format!("{rel}: {}", e.message())))?;
        let bytes = committed.read(rel).map_err(|e| config(e.to_string()))?;
        crate::provider::Replay::parse(bytes, rel)
    }

    /// The loop's inputs, from the resolved configuration.
    pub(super) fn loop_config(&self, chain: &ProviderChain) -> LoopConfig {
        // A handle on the fire's own repository (the one `prepare` opened through the
        // one way in), for the loop's thread of work: HEAD is read at each check, as
        // other fires commit meanwhile. Opened at the first check, not before the first
        // request: a fire whose model writes nothing never needs it.
        let git_dir = self.repo.path().to_path_buf();
        let head = std::cell::OnceCell::new();
        let root = self.ctx.opts.root.clone();
        let run = self.ctx.approval_run().to_string();
        // Only a paused run being resumed can have a builder's decision waiting; a
        // fresh run's calls were never seen by a builder.
        let decision: crate::agent::DecisionLookup = match &self.ctx.opts.resume {
            Some(_) => Box::new(move |call, hash| lookup_decision(&root, &run, call, hash)),
            None => Box::new(|_, _| None),
        };
        LoopConfig {
            task: self.ctx.opts.task.clone(),
            run_id: self.ctx.run_id.clone(),
            model: self
                .config
                .prompt
                .front
                .model
                .clone()
                .unwrap_or_else(|| chain.primary.model()),
            tools: self.config.tools.clone(),
            budgets: self.config.budgets,
            limits: self.config.limits,
            max_context: chain.primary.capabilities().max_context,
            max_output_tokens: self.config.limits.max_output_tokens,
            prices: self.config.settings.prices.clone(),
            redactor: self.config.redactor.clone(),
            trace_input: self.config.settings.telemetry.include_content,
            root: self.ctx.opts.root.clone(),
            write_roots: crate::sandbox::acl_dirs(&self.config.settings.permissions.write),
            committed: Box::new(move |rel: &str| {
                head.get_or_init(|| git2::Repository::open(&git_dir).ok())
                    .as_ref()
                    .is_some_and(|r| crate::git::head_blob(r, rel).ok().flatten().is_some())
            }),
            decision,
        }
    }

    async fn run_acceptance(
        &mut self,
        worker: &mut WorkerClient,
        cancel: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Vec<AcceptanceRecord> {
        let answer = self.state.final_answer.clone().unwrap_or_default();
        let mut out = Vec::new();
        if self.config.prompt.front.acceptance.iter().any(|a| a.run.is_some()) {
            self.remove_git_reads_before_checks();
        }
        // A worker that ran none of the model's calls, made before the first script.
        let mut fresh: Option<Result<(), String>> = None;
        for a in self.config.prompt.front.acceptance.clone() {
            if *cancel.borrow() {
                self.stop = crate::records::StopReason::Cancelled;
                break;
            }
            self.ctx
                .opts
                .progress
                .event(&Event::AcceptanceStarted { name: a.name.clone() });
            let span = self
                .state
                .trace
                .start(SpanKind::Acceptance, format!("acceptance {}", a.name));
            let mut failures = Vec::new();
            if let Some(needle) = &a.report_contains {
                if !answer.contains(needle.as_str()) {
                    failures.push(format!("report does not contain `{needle}`"));
                }
            }
            if let Some(min) = a.min_report_bytes {
                if answer.len() < min {
                    failures.push(format!("report is {} bytes, under {min}", answer.len()));
                }
            }
            if let Some(script) = &a.run {
                if fresh.is_none() {
                    fresh = Some(worker.fresh_for_checks().await.map_err(|e| e.to_string()));
                }
                match &fresh {
                    // Failed closed: a check in the model's worker could be forged.
                    Some(Err(why)) => failures.push(format!(
                        "{script}: not run: checks run in a tool worker that ran none of the model's calls: {why}"
                    )),
                    _ => failures.extend(self.acceptance_script(worker, cancel, &a.name, script, &answer).await),
                }
            }
            let passed = failures.is_empty();
            self.state
                .trace
                .end(span, if passed { SpanStatus::Ok } else { SpanStatus::Failed });
            out.push(AcceptanceRecord {
                check: a.name.clone(),
                passed,
                detail: self.config.redactor.redact(&failures.join("; ")).into_owned(),
            });
        }
        out
    }

    /// Removes the files git reads (`.gitattributes`, `.gitignore`) the tools made this
    /// fire ([`crate::loop_state::LoopState::made_by_tools`]) and HEAD does not hold, before the
    /// acceptance scripts run: a script that runs git would read them (helper-91: a
    /// model's `.gitignore` of `*` hid its stray files from a `git status` check). The
    /// fire's card names them ([`crate::loop_state::LoopState::removed_before_checks`]).
    fn remove_git_reads_before_checks(&mut self) {
        let head = self.repo.head().ok().and_then(|h| h.peel_to_tree().ok());
        let Ok(dir) = crate::beneath::open_root(&self.ctx.opts.root) else {
            return;
        };
        let made: Vec<String> = (self.state.made_by_tools.iter())
            .filter(|rel| super::outputs::is_git_read(rel))
            .filter(|rel| {
                head.as_ref()
                    .is_none_or(|t| t.get_path(std::path::Path::new(rel)).is_err())
            })
            .cloned()
            .collect();
        for rel in made {
            if crate::beneath::remove_file(&dir, std::path::Path::new(&rel)).is_ok() {
                let why = "git metadata: a file git reads; removed from the work tree before the acceptance checks";
                self.state.removed_before_checks.push((rel, why.into()));
            }
        }
    }

    /// Runs one acceptance script in the worker on the report; `Some` says why it
    /// failed. The script runs apart ([`ToolRequest::apart`]): a fresh `HOME` and
    /// `TMPDIR`, never the scratch the model's commands shared, so a startup file the
    /// model left there (`.bashrc`, a Python `usercustomize`) cannot decide the check;
    /// and in a worker that ran none of the model's calls ([`WorkerClient::fresh_for_checks`],
    /// made so before the first script).
    async fn acceptance_script(
        &self,
        worker: &mut WorkerClient,
        cancel: &mut tokio::sync::watch::Receiver<bool>,
        name: &str,
        script: &str,
        answer: &str,
    ) -> Option<String> {
        // The report is handed over through a runtime-only directory: tools can read
        // the repository but write only the write ACL and the scratch dir, so nothing
        // the model left can redirect this write (a link in scratch would have sent
        // it anywhere the runtime may write) or swap the text the check reads.
        let rel = std::path::PathBuf::from(crate::layout::STATE_DIR)
            .join(crate::layout::HANDOFF_DIR)
            .join(format!("h-{:016x}", rand::random::<u64>()))
            .join("report.md");
        let root = &self.ctx.opts.root;
        if let Err(e) = crate::records::create_new(root, &rel, answer.as_bytes()) {
            return Some(format!("{script}: the report could not be handed over: {e}"));
        }
        let path = root.join(&rel);
        let req = ToolRequest {
            apart: true,
            masked: Vec::new(),
            call_id: format!("acceptance-{name}"),
            args: ToolArgs::RunCommand {
                command: format!(
                    "{} {}",
                    shell_quote(&self.config.script_path(script)),
                    shell_quote(&path.to_string_lossy())
                ),
                timeout_s: None,
            },
            timeout_ms: self.config.limits.prefetch_timeout_s * 1000,
            output_limit: ACCEPTANCE_OUTPUT_BYTES,
        };
        let interrupter = worker.interrupt_handle();
        let running = worker.call(&req);
        tokio::pin!(running);
        let r = tokio::select! {
            r = &mut running => r,
            _ = cancel.changed() => interrupter.until_done(running).await,
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        r.error.map(|_| format!("{script}: {}", r.output.trim()))
    }
}

/// A builder's decision on a paused call of `run`, read from the state database.
fn lookup_decision(root: &std::path::Path, run: &str, call_id: &str, args_hash: &str) -> Option<CallDecision> {
    match StateDb::open(root).and_then(|db| db.decision(run, call_id, args_hash)) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read approvals; the call stays paused");
            None
        }
    }
}

/// The tool worker's process before the loop adopts it. One the fire never adopts (a
/// refused or waiting fire, a sandbox that could not be entered) is killed and reaped
/// when dropped: it never outlives the runtime to say, on the terminal, that the
/// runtime that started it has ended.
pub(crate) struct WorkerProcess {
    child: Option<std::process::Child>,
    /// What it was sent, when its configuration went out in the preparation.
    pub sent: Option<WorkerSetup>,
    /// The spare ([`spawn_parked`]), spawned by a thread of its own while the
    /// preparation goes on; [`FireRun::enter_sandbox`] joins it before the runtime
    /// restricts itself, when no other thread may exist.
    spare: Option<std::thread::JoinHandle<std::io::Result<std::process::Child>>>,
}

impl WorkerProcess {
    pub fn new(child: std::process::Child) -> WorkerProcess {
        WorkerProcess {
            child: Some(child),
            sent: None,
            spare: None,
        }
    }

    /// As [`WorkerProcess::new`], with the spare being spawned meanwhile.
    pub fn with_spare(
        child: std::process::Child,
        spare: std::thread::JoinHandle<std::io::Result<std::process::Child>>,
    ) -> WorkerProcess {
        WorkerProcess {
            child: Some(child),
            sent: None,
            spare: Some(spare),
        }
    }

    /// The spare, once its thread ended (`None` when none was being spawned).
    fn join_spare(&mut self) -> Option<std::io::Result<std::process::Child>> {
        let thread = self.spare.take()?;
        Some(
            thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the spare's spawn panicked"))),
        )
    }

    /// Its process, to send it its configuration.
    pub fn child_mut(&mut self) -> Option<&mut std::process::Child> {
        self.child.as_mut()
    }

    /// Its process and what it was sent, for the loop to adopt.
    fn adopt(mut self) -> (Option<std::process::Child>, Option<WorkerSetup>) {
        (self.child.take(), self.sent.take())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let spare = self.join_spare().and_then(Result::ok);
        for mut child in self.child.take().into_iter().chain(spare) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the tool worker of a fire is configured with.
pub(crate) struct WorkerSetup {
    /// Its configuration; its plan takes the masks from the line after it.
    pub config: WorkerConfig,
    /// The plan the runtime walks for the masks.
    pub walk: NamespacePlan,
    /// The spare's plan: a spare walks for itself, if it is ever woken.
    pub spare: NamespacePlan,
}

impl WorkerSetup {
    pub fn new(root: &std::path::Path, repo: &git2::Repository, config: &super::config::FireConfig) -> WorkerSetup {
        let spec = sandbox::worker_spec(
            root,
            &crate::git::git_dirs(repo),
            &config.scratch,
            &config.settings,
            config.policy.ownership(),
        );
        let spare = NamespacePlan::new(
            &spec,
            root,
            config.policy.read_masks(),
            config.settings.sandbox.write_bytes,
        );
        let walk = NamespacePlan {
            masks: MaskSource::NextLine,
            ..spare.clone()
        };
        WorkerSetup {
            config: WorkerConfig {
                root: root.to_path_buf(),
                scratch: config.scratch.clone(),
                isolation: Some(walk.clone()),
                mcp: None,
                spec,
                mode: config.settings.sandbox.landlock,
                env: ExecContext::scrubbed_env(&config.scratch),
            },
            walk,
            spare,
        }
    }
}
