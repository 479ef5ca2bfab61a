//! One fire of a task (DESIGN.md section 4), in phases so the binary can enter the
//! sandbox between them: [`prepare`] (lock, dirty check, load and validate, prefetch)
//! runs single-threaded; the binary then restricts itself with Landlock and starts its
//! async runtime for [`run`] (tool worker, loop, acceptance checks); [`finish`] writes
//! the report, receipt and cards and commits them under the runtime identity.

use crate::agent::worker_client::WorkerClient;
use crate::agent::{self, context, CardDraft, LoopConfig, LoopState};
use crate::layout::{Owner, Ownership, SCOPE_FILE, SETTINGS_FILE, STATE_DIR};
use crate::policy::Policy;
use crate::prompt::{self, Prompt};
use crate::provider::{Message, Provider, ProviderChain, RetryPolicy};
use crate::records::{self, AcceptanceRecord, Card, CardKind, Inputs, Receipt, RunStatus, SandboxRecord, StopReason};
use crate::sandbox::{self, landlock};
use crate::secrets::Redactor;
use crate::settings::{self, RuntimeSettings};
use crate::store::Store;
use crate::tools::exec::ExecContext;
use crate::tools::{ToolArgs, ToolRequest};
use crate::trace::{SpanKind, SpanStatus, Trace};
use crate::worker::WorkerConfig;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Exit codes (DESIGN.md section 7).
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILED: i32 = 1;
    pub const CONFIG: i32 = 2;
    pub const SKIPPED: i32 = 3;
    pub const WAITING: i32 = 4;
    pub const INTERNAL: i32 = 70;
}

/// Output of a fire, printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct FireSummary {
    pub run_id: String,
    pub task: String,
    pub status: RunStatus,
    pub stop_reason: StopReason,
    pub exit_code: i32,
    pub report: Option<String>,
    pub receipt: Option<String>,
    pub cards: Vec<String>,
    pub commit: Option<String>,
    pub message: String,
}

pub struct FireOptions {
    pub root: PathBuf,
    pub task: String,
    pub no_commit: bool,
    /// Program and arguments that start the tool worker.
    pub worker_cmd: (PathBuf, Vec<String>),
    /// Continue this paused run from its checkpoint instead of starting afresh.
    pub resume: Option<String>,
}

/// A fire that passed preparation.
pub struct FireRun {
    /// The run whose approvals apply: this one, or the paused run being resumed.
    approval_run: String,
    opts: FireOptions,
    run_id: String,
    started_at: DateTime<Utc>,
    started: Instant,
    _lock: File,
    settings: RuntimeSettings,
    prompt: Prompt,
    policy: Policy,
    inputs: Inputs,
    redactor: Redactor,
    scratch: PathBuf,
    pub sandbox: SandboxRecord,
    state: LoopState,
    stop: StopReason,
    acceptance: Vec<AcceptanceRecord>,
    provider_ports: Vec<u16>,
    /// Opened for the dirty check and kept for the commit: git's index is loaded
    /// once per fire, not twice (0.3 s a load at 220,000 tracked files).
    repo: git2::Repository,
}

pub enum Prepared {
    Ready(Box<FireRun>),
    Done(FireSummary),
}

/// Steps 1-4: lock, dirty check, load and validate, prefetch.
pub fn prepare(opts: FireOptions) -> Prepared {
    let started_at = Utc::now();
    let started = Instant::now();
    let run_id = records::new_id(started_at, &opts.task);
    let root = opts.root.clone();
    let early = |kind: Option<CardKind>,
                 status: RunStatus,
                 code: i32,
                 summary: String,
                 detail: String,
                 settings: Option<&RuntimeSettings>,
                 inputs: Inputs| {
        early_finish(
            &opts, &run_id, started_at, kind, status, code, summary, detail, settings, inputs,
        )
    };
    if !prompt::valid_task_name(&opts.task) {
        return Prepared::Done(not_started(
            run_id,
            opts.task.clone(),
            RunStatus::Failed,
            exit::CONFIG,
            format!("`{}` is not a valid task name (letters, digits, `-`, `_`)", opts.task),
        ));
    }
    let state_dir = root.join(STATE_DIR);
    let lock = match take_lock(&state_dir.join("locks").join(format!("{}.lock", opts.task)), false) {
        Ok(Some(f)) => f,
        Ok(None) => {
            record_skip(&root, &run_id, &opts.task, started_at);
            return Prepared::Done(not_started(
                run_id,
                opts.task.clone(),
                RunStatus::Skipped,
                exit::SKIPPED,
                "another fire of this task holds the lock",
            ));
        }
        Err(e) => return Prepared::Done(internal(&run_id, &opts.task, format!("cannot take the task lock: {e}"))),
    };
    let repo = match git2::Repository::open(&root).map_err(|e| crate::git::GitError::NotARepo {
        path: root.clone(),
        message: e.message().to_string(),
    }) {
        Ok(r) => r,
        Err(e) => {
            return Prepared::Done(not_started(
                run_id,
                opts.task.clone(),
                RunStatus::Failed,
                exit::CONFIG,
                e.to_string(),
            ))
        }
    };
    let mut inputs = Inputs {
        provider: String::new(),
        model: String::new(),
        ..Inputs::default()
    };
    inputs.commit = crate::git::head_commit(&repo).ok().flatten().map(|o| o.to_string());
    // Builder paths must be committed: the fire runs on reviewed versions only.
    let loaded = settings::load(&root);
    let extra_builder: Vec<String> = loaded
        .as_ref()
        .map(|s| s.runtime.builder_paths.clone())
        .unwrap_or_default();
    let ownership = Ownership::new(&root)
        .with_globs(&extra_builder, &[])
        .unwrap_or_else(|_| Ownership::new(&root));
    match crate::git::dirty_builder_paths(&repo, &ownership) {
        Ok(dirty) if !dirty.is_empty() => {
            return Prepared::Done(early(
                Some(CardKind::UnreviewedChanges),
                RunStatus::Failed,
                exit::FAILED,
                format!("{} builder-owned path(s) have uncommitted changes", dirty.len()),
                format!("refusing to fire on unreviewed changes: {}", dirty.join(", ")),
                None,
                inputs,
            ));
        }
        Ok(_) => {}
        Err(e) => return Prepared::Done(internal(&run_id, &opts.task, e.to_string())),
    }
    tracing::debug!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "lock taken, builder paths clean"
    );
    let loaded = match loaded {
        Ok(s) => s,
        Err(d) => {
            return Prepared::Done(early(
                Some(CardKind::InvalidConfig),
                RunStatus::Failed,
                exit::CONFIG,
                format!("invalid settings: {}", first_line(&d.to_string())),
                d.to_string(),
                None,
                inputs,
            ))
        }
    };
    let s = loaded.runtime;
    let prompt = match prompt::load(&root, &opts.task, &s) {
        Ok(p) => p,
        Err(d) => {
            let text = crate::diag::Diagnostics(d).to_string();
            return Prepared::Done(early(
                Some(CardKind::InvalidConfig),
                RunStatus::Failed,
                exit::CONFIG,
                format!("invalid prompt: {}", first_line(&text)),
                text,
                Some(&s),
                inputs,
            ));
        }
    };
    let scope = std::fs::read_to_string(root.join(SCOPE_FILE)).unwrap_or_default();
    if scope.trim().is_empty() {
        return Prepared::Done(early(
            Some(CardKind::InvalidConfig),
            RunStatus::Failed,
            exit::CONFIG,
            "scope/SCOPE.md is missing or empty".into(),
            format!("{SCOPE_FILE}:0: the boundary document is required"),
            Some(&s),
            inputs,
        ));
    }
    let mut perms = s.permissions.clone();
    perms.deny.extend(prompt.front.deny.iter().cloned());
    let scratch = state_dir.join("scratch").join(&run_id);
    let policy = match Policy::new(&root, &perms, &s.builder_paths) {
        Ok(p) => p.with_scratch(&scratch),
        Err(e) => {
            return Prepared::Done(early(
                Some(CardKind::InvalidConfig),
                RunStatus::Failed,
                exit::CONFIG,
                "invalid permissions".into(),
                e.to_string(),
                Some(&s),
                inputs,
            ))
        }
    };
    let blob = |p: &str| crate::git::head_blob(&repo, p).ok().flatten().map(|o| o.to_string());
    inputs.prompt = blob(&prompt.file.to_string_lossy());
    inputs.scope = blob(SCOPE_FILE);
    inputs.settings = blob(SETTINGS_FILE);
    inputs.provider = format!("{:?}", s.provider.kind).to_lowercase();
    let redactor = Redactor::from_env(
        [&s.provider, s.fallback.as_ref().unwrap_or(&s.provider)]
            .iter()
            .filter_map(|p| p.api_key_env.as_deref()),
    );
    let provider_ports: Vec<u16> = [Some(&s.provider), s.fallback.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(crate::provider::provider_port)
        .collect();
    // Prefetch: builder scripts, deterministic, before any model call.
    let mut trace = Trace::default();
    let mut prefetched = String::new();
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        return Prepared::Done(internal(&run_id, &opts.task, format!("{}: {e}", scratch.display())));
    }
    // A resumed run continues its checkpointed conversation: no prefetch again.
    let checkpoint = match &opts.resume {
        None => None,
        Some(orig) => match load_checkpoint(&root, orig) {
            Ok(Some((_, state))) => Some(state),
            Ok(None) => {
                return Prepared::Done(not_started(
                    run_id,
                    opts.task.clone(),
                    RunStatus::Failed,
                    exit::CONFIG,
                    format!("run `{orig}` has no checkpoint to resume"),
                ))
            }
            Err(e) => return Prepared::Done(internal(&run_id, &opts.task, e)),
        },
    };
    for p in prompt.front.prefetch.iter().filter(|_| checkpoint.is_none()) {
        let span = trace.start(SpanKind::Prefetch, format!("prefetch {}", p.name), None);
        let timeout = Duration::from_secs(p.timeout_s.unwrap_or(s.limits.prefetch_timeout_s));
        match run_builder_script(&root, &scratch, &p.run, &p.args, timeout, s.limits.tool_output_bytes) {
            Ok(out) => {
                trace.attr(span, "agent.output_bytes", out.len() as u64);
                trace.end(span, SpanStatus::Ok);
                prefetched.push_str(&format!(
                    "\n\n### {}\n\n```\n{}\n```",
                    p.name,
                    redactor.redact(out.trim_end())
                ));
            }
            Err(why) => {
                trace.end(span, SpanStatus::Error);
                let _ = std::fs::remove_dir_all(&scratch);
                return Prepared::Done(early(
                    Some(CardKind::PrefetchFailed),
                    RunStatus::Failed,
                    exit::FAILED,
                    format!("prefetch `{}` failed", p.name),
                    format!("{}: {}", p.run, redactor.redact(&why)),
                    Some(&s),
                    inputs,
                ));
            }
        }
    }
    let user = if prefetched.is_empty() {
        prompt.body.clone()
    } else {
        format!("{}\n\n## Prefetched context{prefetched}", prompt.body.trim_end())
    };
    let state = match checkpoint {
        Some(mut state) => {
            state.trace = trace;
            state.cards.clear();
            state
        }
        None => {
            let mut state = LoopState::default();
            state.messages = vec![
                Message::System {
                    content: context::system_prompt(&scope),
                },
                Message::User { content: user },
            ];
            state.trace = trace;
            state
        }
    };
    let approval_run = opts.resume.clone().unwrap_or_else(|| run_id.clone());
    Prepared::Ready(Box::new(FireRun {
        approval_run,
        opts,
        run_id,
        started_at,
        started,
        _lock: lock,
        settings: s,
        prompt,
        policy,
        inputs,
        redactor,
        scratch,
        sandbox: SandboxRecord::default(),
        state,
        stop: StopReason::NotStarted,
        acceptance: Vec::new(),
        provider_ports,
        repo,
    }))
}

impl FireRun {
    /// Step 5a: restrict this process (no threads may exist yet): writes only to its
    /// records, state and git objects; TCP only to the provider. Returns a summary
    /// when the fire must stop because the sandbox cannot be entered.
    pub fn enter_sandbox(&mut self) -> Option<FireSummary> {
        let spec = sandbox::runtime_spec(&self.opts.root, &self.provider_ports);
        let result = sandbox::prepare_dirs(&spec)
            .map_err(|e| e.to_string())
            .and_then(|_| landlock::enforce(&spec, self.settings.sandbox.landlock).map_err(|e| e.to_string()));
        match result {
            Ok(rec) => {
                self.sandbox = rec;
                None
            }
            Err(why) => Some(self.abort(
                CardKind::SandboxUnavailable,
                "the sandbox could not be entered".into(),
                why,
            )),
        }
    }

    fn abort(&mut self, kind: CardKind, summary: String, detail: String) -> FireSummary {
        self.state.cards.push(CardDraft {
            kind,
            summary: summary.clone(),
            detail,
            evidence: vec![format!("kernel Landlock ABI {}", landlock::kernel_abi())],
        });
        self.stop = StopReason::NotStarted;
        let mut s = self.finish_inner(Some(RunStatus::Failed));
        s.message = summary;
        s
    }

    /// Step 5b: start the sandboxed tool worker and run the loop, then the acceptance
    /// checks (inside the worker too: they read what the model wrote).
    pub async fn run(&mut self, mut cancel: tokio::sync::watch::Receiver<bool>) -> Option<FireSummary> {
        let s = &self.settings;
        let root = self.opts.root.clone();
        let spec = sandbox::worker_spec(&root, &self.scratch, s, self.policy.ownership());
        let config = WorkerConfig {
            root: root.clone(),
            scratch: self.scratch.clone(),
            spec,
            mode: s.sandbox.landlock,
            env: ExecContext::scrubbed_env(&self.scratch),
        };
        let (exe, args) = &self.opts.worker_cmd;
        let mut worker = match WorkerClient::spawn(exe, args, &config).await {
            Ok(w) => w,
            Err(e) => {
                return Some(self.abort(
                    CardKind::SandboxUnavailable,
                    "the tool worker could not enter its sandbox".into(),
                    e.to_string(),
                ))
            }
        };
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "tool worker sandboxed and ready"
        );
        // The receipt records the sandbox that model-run actions ran in.
        let main_sandbox = std::mem::take(&mut self.sandbox);
        self.sandbox = worker.sandbox.clone();
        if main_sandbox.landlock != self.sandbox.landlock {
            self.sandbox
                .rights
                .push(format!("runtime process: {}", main_sandbox.landlock));
        }
        let retry = RetryPolicy::from_limits(&s.limits);
        let chain = match Provider::new(&s.provider, &root, retry).and_then(|primary| {
            let fallback = s
                .fallback
                .as_ref()
                .map(|f| Provider::new(f, &root, retry))
                .transpose()?;
            Ok(ProviderChain { primary, fallback })
        }) {
            Ok(c) => c,
            Err(e) => {
                worker.shutdown().await;
                self.state.cards.push(CardDraft {
                    kind: CardKind::InvalidConfig,
                    summary: "provider could not be set up".into(),
                    detail: self.redactor.redact(&e.to_string()).into_owned(),
                    evidence: vec![],
                });
                self.stop = StopReason::NotStarted;
                let mut summary = self.finish_inner(Some(RunStatus::Failed));
                summary.exit_code = exit::CONFIG;
                return Some(summary);
            }
        };
        let model = self.prompt.front.model.clone().unwrap_or_else(|| chain.primary.model());
        self.inputs.model = model.clone();
        let repo_root = root.clone();
        let head_tree = git2::Repository::open(&repo_root).ok();
        let state_db = root.join(STATE_DIR).join("state.db");
        let cfg = LoopConfig {
            task: self.opts.task.clone(),
            run_id: self.run_id.clone(),
            model,
            tools: self.prompt.tools(s),
            budgets: self.prompt.budgets(s),
            limits: s.limits,
            max_context: chain.primary.capabilities().max_context,
            max_output_tokens: 4096,
            prices: s.prices.clone(),
            redactor: self.redactor.clone(),
            committed: Box::new(move |rel: &str| {
                head_tree
                    .as_ref()
                    .is_some_and(|r| crate::git::head_blob(r, rel).ok().flatten().is_some())
            }),
            approval: {
                let run = self.approval_run.clone();
                Box::new(move |call, hash| lookup_approval(&state_db, &run, call, hash))
            },
        };
        self.stop = agent::run(
            &cfg,
            &mut self.state,
            &chain,
            &self.policy,
            &mut worker,
            &mut cancel,
            self.started,
        )
        .await;
        if self.stop == StopReason::FinalAnswer {
            self.acceptance = self.run_acceptance(&mut worker).await;
        }
        worker.shutdown().await;
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            steps = self.state.step,
            "loop finished"
        );
        None
    }

    async fn run_acceptance(&mut self, worker: &mut WorkerClient) -> Vec<AcceptanceRecord> {
        let answer = self.state.final_answer.clone().unwrap_or_default();
        let mut out = Vec::new();
        for a in self.prompt.front.acceptance.clone() {
            let span = self
                .state
                .trace
                .start(SpanKind::Acceptance, format!("acceptance {}", a.name), None);
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
                // The report is handed over on the scratch dir, which the worker may read.
                let path = self.scratch.join("report.md");
                let _ = std::fs::write(&path, &answer);
                let cmd = format!("{} {}", shell_quote(script), shell_quote(&path.to_string_lossy()));
                let req = ToolRequest {
                    call_id: format!("acceptance-{}", a.name),
                    args: ToolArgs::RunCommand {
                        command: cmd,
                        timeout_s: None,
                    },
                    timeout_ms: self.settings.limits.prefetch_timeout_s * 1000,
                    output_limit: 4096,
                };
                let r = worker.call(&req).await;
                if r.error.is_some() {
                    failures.push(format!("{script}: {}", r.output.trim()));
                }
            }
            let passed = failures.is_empty();
            self.state
                .trace
                .end(span, if passed { SpanStatus::Ok } else { SpanStatus::Failed });
            out.push(AcceptanceRecord {
                check: a.name.clone(),
                passed,
                detail: self.redactor.redact(&failures.join("; ")).into_owned(),
            });
        }
        out
    }

    /// Step 6: report, cards, receipt, trace, commit.
    pub fn finish(mut self) -> FireSummary {
        self.finish_inner(None)
    }

    fn finish_inner(&mut self, forced: Option<RunStatus>) -> FireSummary {
        let finished_at = Utc::now();
        let failed_checks: Vec<&AcceptanceRecord> = self.acceptance.iter().filter(|a| !a.passed).collect();
        if !failed_checks.is_empty() {
            let detail = failed_checks
                .iter()
                .map(|a| format!("{}: {}", a.check, a.detail))
                .collect::<Vec<_>>()
                .join("\n");
            self.state.cards.push(CardDraft {
                kind: CardKind::AcceptanceFailed,
                summary: format!("{} acceptance check(s) failed", failed_checks.len()),
                detail,
                evidence: vec![],
            });
        }
        let status = forced.unwrap_or(match self.stop {
            StopReason::FinalAnswer if !failed_checks.is_empty() => RunStatus::Failed,
            StopReason::FinalAnswer if self.acceptance.is_empty() => RunStatus::Completed,
            StopReason::FinalAnswer => RunStatus::Accepted,
            StopReason::WaitingApproval => RunStatus::WaitingApproval,
            StopReason::Cancelled => RunStatus::Cancelled,
            StopReason::MaxSteps
            | StopReason::MaxWallTime
            | StopReason::TokenBudget
            | StopReason::CostBudget
            | StopReason::RepeatedCall
            | StopReason::RepeatedError
            | StopReason::PermissionDenied
            | StopReason::ProviderError
            | StopReason::NotStarted => RunStatus::Failed,
        });
        if self.stop == StopReason::Cancelled {
            self.state.cards.push(CardDraft {
                kind: CardKind::Crashed,
                summary: "the fire was cancelled by a signal".into(),
                detail: "SIGINT or SIGTERM".into(),
                evidence: vec![format!("step {}", self.state.step)],
            });
        }
        let mut summary = write_records(
            &self.opts,
            &self.run_id,
            self.started_at,
            finished_at,
            status,
            self.stop,
            &self.inputs,
            &self.sandbox,
            &self.state,
            &self.acceptance,
            &self.redactor,
            Some(&self.settings),
            Some(&self.repo),
        );
        tracing::debug!(
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "records written and committed"
        );
        // The checkpoint lets `runtime resume` continue a paused run.
        if status == RunStatus::WaitingApproval {
            let _ = save_checkpoint(&self.opts.root, &self.approval_run, &self.opts.task, &self.state);
        } else if self.opts.resume.is_some() {
            let _ = delete_checkpoint(&self.opts.root, &self.approval_run);
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
        summary.message = format!(
            "{} {} ({}), {} steps",
            self.opts.task,
            status.as_str(),
            self.stop.as_str(),
            self.state.step
        );
        summary
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// The outcome of a fire that ended before writing any record.
fn not_started(
    run_id: impl Into<String>,
    task: impl Into<String>,
    status: RunStatus,
    exit_code: i32,
    message: impl Into<String>,
) -> FireSummary {
    FireSummary {
        run_id: run_id.into(),
        task: task.into(),
        status,
        stop_reason: StopReason::NotStarted,
        exit_code,
        report: None,
        receipt: None,
        cards: vec![],
        commit: None,
        message: message.into(),
    }
}

fn internal(run_id: &str, task: &str, message: String) -> FireSummary {
    not_started(run_id, task, RunStatus::Failed, exit::INTERNAL, message)
}

#[allow(clippy::too_many_arguments)]
fn early_finish(
    opts: &FireOptions,
    run_id: &str,
    started_at: DateTime<Utc>,
    kind: Option<CardKind>,
    status: RunStatus,
    code: i32,
    summary: String,
    detail: String,
    settings: Option<&RuntimeSettings>,
    inputs: Inputs,
) -> FireSummary {
    let mut state = LoopState::default();
    if let Some(kind) = kind {
        state.cards.push(CardDraft {
            kind,
            summary: summary.clone(),
            detail,
            evidence: vec![],
        });
    }
    let redactor = Redactor::from_env(
        settings
            .iter()
            .flat_map(|s| {
                [
                    s.provider.api_key_env.as_deref(),
                    s.fallback.as_ref().and_then(|f| f.api_key_env.as_deref()),
                ]
            })
            .flatten(),
    );
    let mut out = write_records(
        opts,
        run_id,
        started_at,
        Utc::now(),
        status,
        StopReason::NotStarted,
        &inputs,
        &SandboxRecord::default(),
        &state,
        &[],
        &redactor,
        settings,
        None,
    );
    if out.exit_code != exit::INTERNAL {
        out.exit_code = code;
    }
    out.message = summary;
    out
}

/// Writes cards, report and receipt (create-only), stores the trace, and commits.
#[allow(clippy::too_many_arguments)]
fn write_records(
    opts: &FireOptions,
    run_id: &str,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    status: RunStatus,
    stop: StopReason,
    inputs: &Inputs,
    sandbox_rec: &SandboxRecord,
    state: &LoopState,
    acceptance: &[AcceptanceRecord],
    redactor: &Redactor,
    settings: Option<&RuntimeSettings>,
    repo: Option<&git2::Repository>,
) -> FireSummary {
    let root = &opts.root;
    let task = &opts.task;
    let mut files: Vec<String> = Vec::new();
    let mut card_ids = Vec::new();
    let mut error: Option<String> = None;
    for draft in &state.cards {
        let card = Card::new(
            draft.kind,
            task,
            run_id,
            redactor.redact(&draft.summary),
            redactor.redact(&draft.detail),
            draft.evidence.iter().map(|e| redactor.redact(e).into_owned()).collect(),
            finished_at,
        );
        let rel = card.rel_path();
        match records::card_yaml(&card).and_then(|y| records::create_new(root, &rel, y.as_bytes())) {
            Ok(()) => {
                files.push(rel.to_string_lossy().into_owned());
                card_ids.push(card.id.clone());
            }
            Err(e) => error = Some(e.to_string()),
        }
    }
    let cost = (state.cost_usd * 1e6).round() / 1e6;
    let report_rel = records::report_path(task, run_id, started_at);
    let report = render_report(task, run_id, status, stop, state, cost, acceptance);
    match records::create_new(root, &report_rel, redactor.redact(&report).as_bytes()) {
        Ok(()) => files.push(report_rel.to_string_lossy().into_owned()),
        Err(e) => error = Some(e.to_string()),
    }
    let receipt_rel = records::receipt_path(task, run_id, started_at);
    let receipt = Receipt {
        run_id: run_id.into(),
        task: task.clone(),
        status,
        stop_reason: stop,
        started_at,
        finished_at,
        inputs: inputs.clone(),
        sandbox: sandbox_rec.clone(),
        steps: state.step,
        tool_calls: state.tool_calls.clone(),
        tokens: state.tokens,
        cost_usd: cost,
        retries: state.retries,
        denials: state.denials,
        outputs: vec![report_rel.to_string_lossy().into_owned()],
        cards: card_ids.clone(),
        acceptance: acceptance.to_vec(),
        resumed_from: opts.resume.clone(),
    };
    match records::receipt_json(&receipt)
        .and_then(|j| records::create_new(root, &receipt_rel, redactor.redact(&j).as_bytes()))
    {
        Ok(()) => files.push(receipt_rel.to_string_lossy().into_owned()),
        Err(e) => error = Some(e.to_string()),
    }
    let t = std::time::Instant::now();
    if let Ok(mut store) = Store::open(&root.join(STATE_DIR).join("state.db")) {
        if let Err(e) = state.trace.save(
            &mut store,
            &receipt,
            &receipt_rel.to_string_lossy(),
            &report_rel.to_string_lossy(),
        ) {
            tracing::warn!(error = %e, "could not store the trace");
        }
    }
    tracing::debug!(store_ms = t.elapsed().as_secs_f64() * 1e3, "trace stored");
    let t = std::time::Instant::now();
    let mut commit = None;
    if !opts.no_commit && error.is_none() {
        let identity = settings.map(|s| s.runtime_identity.clone()).unwrap_or_default();
        match commit_records(
            root,
            repo,
            &files,
            &identity.name,
            &identity.email,
            task,
            run_id,
            status,
        ) {
            Ok(c) => commit = Some(c),
            Err(e) => error = Some(format!("commit failed: {e}")),
        }
    }
    tracing::debug!(commit_ms = t.elapsed().as_secs_f64() * 1e3, "records committed");
    let exit_code = if let Some(e) = &error {
        tracing::error!(error = %e, "writing the fire's records failed");
        exit::INTERNAL
    } else {
        match status {
            RunStatus::Accepted | RunStatus::Completed => exit::OK,
            RunStatus::Failed | RunStatus::Cancelled => exit::FAILED,
            RunStatus::Skipped => exit::SKIPPED,
            RunStatus::WaitingApproval => exit::WAITING,
        }
    };
    FireSummary {
        run_id: run_id.into(),
        task: task.clone(),
        status,
        stop_reason: stop,
        exit_code,
        report: Some(report_rel.to_string_lossy().into_owned()),
        receipt: Some(receipt_rel.to_string_lossy().into_owned()),
        cards: card_ids,
        commit,
        message: error.unwrap_or_default(),
    }
}

/// Commits the fire's records with `repo` (the fire's own handle), or a fresh one
/// when the fire ended before it had one.
#[allow(clippy::too_many_arguments)]
fn commit_records(
    root: &Path,
    repo: Option<&git2::Repository>,
    files: &[String],
    name: &str,
    email: &str,
    task: &str,
    run_id: &str,
    status: RunStatus,
) -> Result<String, String> {
    let _guard = take_lock(&root.join(STATE_DIR).join("locks").join("commit.lock"), true).map_err(|e| e.to_string())?;
    let opened;
    let repo = match repo {
        Some(r) => r,
        None => {
            opened = git2::Repository::open(root).map_err(|e| e.to_string())?;
            &opened
        }
    };
    let own = Ownership::new(root);
    let msg = format!(
        "runtime: {task} {} ({run_id})\n\nRun-Id: {run_id}\nTask: {task}\nStatus: {}\n",
        status.as_str(),
        status.as_str()
    );
    crate::git::commit_new_files(
        repo,
        files,
        |p| {
            own.classify(p) == Owner::Runtime
                && crate::layout::RUNTIME_DIRS
                    .iter()
                    .any(|d| p.starts_with(&format!("{d}/")))
        },
        name,
        email,
        &msg,
    )
    .map(|o| {
        match crate::git::auto_gc(repo) {
            crate::git::AutoGc::NotNeeded => {}
            crate::git::AutoGc::Ran => tracing::info!("packed loose objects (git gc --auto)"),
            crate::git::AutoGc::Failed(e) => tracing::warn!(error = %e, "loose objects were not packed"),
        }
        o.to_string()
    })
    .map_err(|e| e.to_string())
}

fn render_report(
    task: &str,
    run_id: &str,
    status: RunStatus,
    stop: StopReason,
    state: &LoopState,
    cost: f64,
    acceptance: &[AcceptanceRecord],
) -> String {
    let mut r = format!(
        "<!-- runtime report -->\n| task | run | status | stop reason | steps | tokens | cost |\n|---|---|---|---|---|---|---|\n| {task} | {run_id} | {} | {} | {} | {} | ${cost:.4} |\n\n",
        status.as_str(),
        stop.as_str(),
        state.step,
        state.tokens.total()
    );
    if !acceptance.is_empty() {
        r.push_str("Acceptance: ");
        r.push_str(
            &acceptance
                .iter()
                .map(|a| format!("{} {}", if a.passed { "✓" } else { "✗" }, a.check))
                .collect::<Vec<_>>()
                .join(", "),
        );
        r.push_str("\n\n");
    }
    match &state.final_answer {
        Some(a) => r.push_str(a.trim_end()),
        None => {
            r.push_str(&format!(
                "_No final answer: the fire stopped with `{}`._",
                stop.as_str()
            ));
            if let Some(c) = &state.last_content {
                r.push_str("\n\nLast message from the model:\n\n");
                r.push_str(c.trim_end());
            }
        }
    }
    r.push('\n');
    r
}

/// Runs a builder script from `tools/` with a timeout and a scrubbed environment.
fn run_builder_script(
    root: &Path,
    scratch: &Path,
    script: &str,
    args: &[String],
    timeout: Duration,
    cap: usize,
) -> Result<String, String> {
    let ctx = ExecContext {
        root: root.to_path_buf(),
        scratch: scratch.to_path_buf(),
        env: ExecContext::scrubbed_env(scratch),
    };
    let mut cmd = shell_quote(script);
    for a in args {
        cmd.push(' ');
        cmd.push_str(&shell_quote(a));
    }
    if !root.join(script).is_file() {
        return Err(format!("script `{script}` does not exist"));
    }
    let req = ToolRequest {
        call_id: "prefetch".into(),
        args: ToolArgs::RunCommand {
            command: cmd,
            timeout_s: None,
        },
        timeout_ms: timeout.as_millis() as u64,
        output_limit: cap,
    };
    let r = crate::tools::exec::execute(&ctx, &req);
    match r.error {
        None => Ok(r.output),
        Some(c) => Err(format!("{}: {}", c.as_str(), r.output.trim())),
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Takes an flock on `path`; `Ok(None)` when busy and `wait` is false.
fn take_lock(path: &Path, wait: bool) -> std::io::Result<Option<File>> {
    use std::os::unix::io::AsRawFd;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), op) };
    if rc == 0 {
        Ok(Some(f))
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(e)
        }
    }
}

fn record_skip(root: &Path, run_id: &str, task: &str, at: DateTime<Utc>) {
    if let Ok(mut store) = Store::open(&root.join(STATE_DIR).join("state.db")) {
        let _ = store.write(|tx| tx.execute("INSERT OR REPLACE INTO runs (run_id, task, status, stop_reason, started_at, finished_at) VALUES (?1, ?2, 'skipped', 'not_started', ?3, ?3)", rusqlite::params![run_id, task, at.to_rfc3339()]));
    }
}

fn lookup_approval(db: &Path, run_id: &str, call_id: &str, args_hash: &str) -> Option<bool> {
    let store = Store::open(db).ok()?;
    store
        .conn()
        .query_row(
            "SELECT decision FROM approvals WHERE run_id = ?1 AND call_id = ?2 AND args_hash = ?3",
            [run_id, call_id, args_hash],
            |r| r.get::<_, String>(0),
        )
        .ok()
        .map(|d| d == "approve")
}

fn delete_checkpoint(root: &Path, run_id: &str) -> Result<(), String> {
    let mut store = Store::open(&root.join(STATE_DIR).join("state.db")).map_err(|e| e.to_string())?;
    store
        .write(|tx| tx.execute("DELETE FROM checkpoints WHERE run_id = ?1", [run_id]))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// A paused run's checkpoint: its task and loop state.
pub fn load_checkpoint(root: &Path, run_id: &str) -> Result<Option<(String, LoopState)>, String> {
    let store = Store::open(&root.join(STATE_DIR).join("state.db")).map_err(|e| e.to_string())?;
    let blob: Option<String> = store
        .conn()
        .query_row("SELECT state FROM checkpoints WHERE run_id = ?1", [run_id], |r| {
            r.get(0)
        })
        .ok();
    let Some(blob) = blob else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(&blob).map_err(|e| e.to_string())?;
    let task = v["task"].as_str().unwrap_or_default().to_string();
    let state: LoopState = serde_json::from_value(v["state"].clone()).map_err(|e| e.to_string())?;
    Ok(Some((task, state)))
}

/// Records a builder's decision on a paused call, bound to the call's hash.
pub fn record_approval(root: &Path, run_id: &str, call_id: &str, approve: bool, by: &str) -> Result<String, String> {
    let (_, state) = load_checkpoint(root, run_id)?
        .ok_or_else(|| format!("run `{run_id}` has no checkpoint waiting for approval"))?;
    let pending = state
        .pending
        .ok_or_else(|| format!("run `{run_id}` is not waiting for an approval"))?;
    if pending.call.id != call_id {
        return Err(format!(
            "run `{run_id}` waits on call `{}`, not `{call_id}`",
            pending.call.id
        ));
    }
    let hash = agent::call_hash(&pending.call.name, &pending.call.arguments);
    if hash != pending.args_hash {
        return Err("the paused call does not match its recorded hash".into());
    }
    let mut store = Store::open(&root.join(STATE_DIR).join("state.db")).map_err(|e| e.to_string())?;
    let decision = if approve { "approve" } else { "deny" };
    store
        .write(|tx| tx.execute("INSERT OR REPLACE INTO approvals (run_id, call_id, args_hash, decision, by, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)", rusqlite::params![run_id, call_id, hash, decision, by, Utc::now().to_rfc3339()]))
        .map_err(|e| e.to_string())?;
    Ok(format!("{} {}", pending.call.name, pending.call.arguments))
}

fn save_checkpoint(root: &Path, run_id: &str, task: &str, state: &LoopState) -> Result<(), String> {
    let mut store = Store::open(&root.join(STATE_DIR).join("state.db")).map_err(|e| e.to_string())?;
    let blob = serde_json::json!({"task": task, "state": state}).to_string();
    store
        .write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, step, state) VALUES (?1, ?2, ?3)",
                rusqlite::params![run_id, state.step, blob],
            )
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}
