//! `runtime fire <task>`: one fire. Preparation runs single-threaded, then the process
//! enters its Landlock sandbox, and only then is the async runtime built for the loop.

use crate::command_error::{self, CommandError, Outcome};
use crate::progress::{self, Mode, Renderer, Terminal, When};
use shared::fire::{self, DryRun, FireEnd, FireOptions, FireSummary, ProviderView};
use shared::text::printable;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

/// Fire a task once
#[derive(Debug, clap::Args)]
#[command(after_help = command_error::exit_codes_help())]
pub struct Args {
    /// Task name (prompts/<task>.md)
    pub task: String,
    /// Write the records but do not commit them
    #[arg(long)]
    pub no_commit: bool,
    /// Print the result as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Resolve everything and print the first model request; call no model
    ///
    /// Prints the settings, the policy, the tools, the prefetch output and the first
    /// request exactly as it would be sent, with the API key redacted; writes no record
    /// and makes no commit. Exit 0 when everything resolved, 2 for a configuration
    /// error, 1 when a prefetch script fails
    #[arg(long, conflicts_with_all = ["print_report", "no_commit"])]
    pub dry_run: bool,
    /// Print the report the fire wrote to stdout at the end
    #[arg(long, conflicts_with = "json")]
    pub print_report: bool,
    /// When to show a live status line on stderr
    ///
    /// The line shows the step, the model call and its elapsed time, each tool call
    /// with its decision, retries and fallback switches. `-v` prints one plain line per
    /// event instead; NO_COLOR turns colour off
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = When::Auto)]
    pub progress: When,
    /// Answer from this recorded trace instead of the settings' provider
    ///
    /// The trace is in the replay provider's format (a `turns` list); there is no
    /// fallback. `builder eval` fires its scripted cases this way, and a card's run can
    /// be re-run with the model responses it recorded
    #[arg(long, value_name = "TRACE")]
    pub replay: Option<std::path::PathBuf>,
    /// Fire for `builder eval`: run an unapproved builder tree (needs --no-commit)
    ///
    /// Under require_reviewed a fire refuses a builder tree no approval covers; an eval
    /// of a proposal under review must run it. Only with --no-commit: nothing such a
    /// fire does is committed, and its receipt names no approval
    #[arg(long, requires_all = ["no_commit", "trusted_settings"])]
    pub eval: bool,
    /// With --eval: the trusted settings file whose powers the fire runs under
    ///
    /// A file in the format of settings/runtime.yaml (`builder eval` writes the base's).
    /// The sandbox, network grants, read directories, provider, fallback, key variables
    /// and telemetry endpoint come from it, or from the revision's settings where they
    /// are narrower; settings (or a prompt's prefetch ports) that would widen any of
    /// them refuse the fire, and it never syncs
    #[arg(long, value_name = "FILE", requires = "eval")]
    pub trusted_settings: Option<std::path::PathBuf>,
}

pub fn run(args: Args, work_tree: shared::git::WorkTree, verbose: bool) -> Result<Outcome, CommandError> {
    let root = &work_tree.root;
    let out = Output {
        json: args.json,
        verbose,
        print_report: args.print_report,
        progress: args.progress,
    };
    if args.dry_run {
        return dry_run(root, args.task, out);
    }
    let fire = Fire {
        task: args.task,
        no_commit: args.no_commit,
        resume: None,
        replay: args.replay,
        eval: args.eval,
        trusted: match &args.trusted_settings {
            Some(file) => Some(shared::powers::load_trusted_file(file).map_err(|e| {
                CommandError::usage(format!("--trusted-settings: {e}"))
                    .hint("the file is a settings/runtime.yaml; `runtime fire --help` describes --eval")
            })?),
            None => None,
        },
        opened: Some(work_tree.repo),
    };
    fire_task(&work_tree.root, fire, out)
}

/// How a fire's outcome is printed.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// The summary as JSON on stdout.
    pub json: bool,
    /// `-v`: a skipped fire says so only then; progress events as plain lines.
    pub verbose: bool,
    /// The report's text on stdout at the end.
    pub print_report: bool,
    /// When to show the live status line.
    pub progress: When,
}

impl Output {
    /// The progress renderer for this output and this terminal.
    fn renderer(&self) -> Arc<Renderer> {
        Arc::new(Renderer::new(progress::mode(
            self.progress,
            self.verbose,
            Terminal::detect(),
        )))
    }
}

/// What one fire is asked to do: the task, whether to commit, the paused run it
/// resumes and the recorded trace it answers from.
pub struct Fire {
    pub task: String,
    pub no_commit: bool,
    pub resume: Option<String>,
    pub replay: Option<std::path::PathBuf>,
    pub eval: bool,
    pub trusted: Option<shared::settings::RuntimeSettings>,
    /// The repository, when the command opened it already to find its root.
    pub opened: Option<git2::Repository>,
}

/// The options of `fire` reporting to `renderer`.
fn options(root: &Path, fire: Fire, renderer: &Arc<Renderer>) -> Result<FireOptions, CommandError> {
    let exe = std::env::current_exe()?;
    Ok(FireOptions {
        root: root.to_path_buf(),
        task: fire.task,
        no_commit: fire.no_commit,
        worker_cmd: (exe, vec![super::WORKER_COMMAND.to_string()]),
        resume: fire.resume,
        progress: renderer.clone(),
        replay: fire.replay,
        eval: fire.eval,
        trusted: fire.trusted,
        opened: fire.opened,
    })
}

/// `--dry-run`: what a fire would run with and send first; nothing sent or written.
fn dry_run(root: &Path, task: String, out: Output) -> Result<Outcome, CommandError> {
    let renderer = out.renderer();
    let fire = Fire {
        task,
        no_commit: false,
        resume: None,
        replay: None,
        eval: false,
        trusted: None,
        opened: None,
    };
    let resolved = fire::dry_run(options(root, fire, &renderer)?);
    renderer.finish();
    match resolved {
        Ok(d) => {
            // The prefetch output is whatever the builder's scripts printed (issue
            // titles, log lines a model once wrote): inert on the terminal.
            if out.json {
                cli::outln!(
                    "{}",
                    shared::text::printable_json(&serde_json::to_string_pretty(&d).unwrap_or_default())
                );
            } else {
                cli::out!("{}", shared::text::printable_multiline(&render_dry_run(&d)));
            }
            Ok(Outcome::Ok)
        }
        Err(summary) => {
            let result = command_error::fire_outcome(&summary);
            print(&summary, command_error::exit_code(&result), out);
            result
        }
    }
}

/// A dry run as text: one line per setting, then the prefetch output and the request.
fn render_dry_run(d: &DryRun) -> String {
    use std::fmt::Write as _;
    let provider = |p: &ProviderView| {
        let mut s = p.kind.clone();
        if let Some(m) = &p.model {
            let _ = write!(s, " {m}");
        }
        if let Some(u) = &p.base_url {
            let _ = write!(s, " at {u}");
        }
        if let Some(k) = &p.api_key_env {
            let _ = write!(s, " (key from ${k})");
        }
        s
    };
    let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(", ") };
    let b = &d.budgets;
    let p = &d.permissions;
    let mut o = String::new();
    let _ = writeln!(o, "dry run of task `{}`: no model call, no records, no commit", d.task);
    for note in &d.notes {
        let _ = writeln!(o, "note: {note}");
    }
    let _ = writeln!(o, "settings:  {}", d.settings_file);
    let _ = writeln!(o, "prompt:    {}", d.prompt_file);
    let _ = writeln!(o, "provider:  {}", provider(&d.provider));
    let _ = writeln!(o, "fallback:  {}", d.fallback.as_ref().map_or("none".into(), provider));
    let _ = writeln!(o, "model:     {}", d.model);
    let _ = writeln!(
        o,
        "budgets:   max_steps {}, max_wall_s {}, max_tokens {}, max_cost_usd {}",
        b.max_steps, b.max_wall_s, b.max_tokens, b.max_cost_usd
    );
    let _ = writeln!(
        o,
        "sandbox:   landlock {}, network {}",
        serde_json::to_value(d.landlock)
            .unwrap_or_default()
            .as_str()
            .unwrap_or("?"),
        serde_json::to_string(&d.network).unwrap_or_default().trim_matches('"')
    );
    let _ = writeln!(
        o,
        "policy:    deny, then ask, then allow; a call no rule matches: {}",
        serde_json::to_value(p.default)
            .unwrap_or_default()
            .as_str()
            .unwrap_or("?")
    );
    let _ = writeln!(o, "  allow:   {}", list(&p.allow));
    let _ = writeln!(o, "  ask:     {}", list(&p.ask));
    let _ = writeln!(o, "  deny:    {}", list(&p.deny));
    let _ = writeln!(o, "  write:   {}", list(&p.write));
    let tools: Vec<String> = d.tools.iter().map(|t| t.to_string()).collect();
    let _ = writeln!(o, "tools:     {}", list(&tools));
    let _ = writeln!(
        o,
        "context:   {} of {} tokens, {} message(s)",
        d.context.used, d.context.budget, d.context.included
    );
    if d.prefetch.trim().is_empty() {
        let _ = writeln!(o, "prefetch:  none");
    } else {
        let _ = writeln!(o, "prefetch:{}", d.prefetch);
    }
    let _ = writeln!(o);
    match &d.request {
        Some(r) => {
            let _ = writeln!(o, "first request (API key redacted):");
            let _ = writeln!(o, "POST {}", r.url);
            for (k, v) in &r.headers {
                let _ = writeln!(o, "{k}: {v}");
            }
            let _ = writeln!(o);
            let _ = writeln!(o, "{}", serde_json::to_string_pretty(&r.body).unwrap_or_default());
        }
        None => {
            let _ = writeln!(
                o,
                "first request: none (the replay provider answers from its recorded trace)"
            );
        }
    }
    o
}

/// One fire, fresh or resumed; shared by `fire` and `resume`.
pub fn fire_task(root: &Path, fire: Fire, out: Output) -> Result<Outcome, CommandError> {
    let renderer = out.renderer();
    let opts = options(root, fire, &renderer)?;
    answer_signals();
    let summary = match fire::prepare(opts) {
        Err(early) => early.finish(),
        Ok(mut run) => {
            if run.enter_sandbox().is_ok() {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                // An abort inside the loop phase is recorded by `finish` below.
                let _ = rt.block_on(async {
                    if let Mode::Live { .. } = renderer.mode() {
                        // On this runtime's one thread: the elapsed time moves while
                        // the loop awaits the model or a tool.
                        let ticking = renderer.clone();
                        tokio::spawn(async move {
                            let mut every = tokio::time::interval(progress::TICK);
                            loop {
                                every.tick().await;
                                ticking.tick();
                            }
                        });
                    }
                    let (tx, rx) = tokio::sync::watch::channel(false);
                    tokio::spawn(async move {
                        use tokio::signal::unix::{signal, SignalKind};
                        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
                            signal(SignalKind::terminate()),
                            signal(SignalKind::interrupt()),
                            signal(SignalKind::hangup()),
                        ) else {
                            return;
                        };
                        // A signal before these listeners existed is in the flag.
                        if !shared::cancel::requested() {
                            tokio::select! {
                                _ = term.recv() => {}
                                _ = int.recv() => {}
                                _ = hup.recv() => {}
                            }
                        }
                        tracing::warn!("signal received; ending the fire as cancelled");
                        let _ = tx.send(true);
                    });
                    run.run(rx).await
                });
            }
            run.finish()
        }
    };
    renderer.finish();
    let result = command_error::fire_outcome(&summary);
    print(&summary, command_error::exit_code(&result), out);
    if out.print_report {
        if let Some(text) = &summary.report_text {
            cli::out!("{}", shared::text::printable_multiline(text));
        }
    }
    result
}

/// From here on SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) end the
/// fire as `cancelled` with its records, in
/// every phase (prefetch included), and a closed pipe (a dead tool worker) is an
/// error the fire handles, never a SIGPIPE that kills it. Spawned processes get the
/// default SIGPIPE back (the standard library resets it in the child).
fn answer_signals() {
    if let Err(e) = shared::cancel::install() {
        tracing::warn!(error = %e, "cannot handle SIGINT/SIGTERM/SIGHUP; a signal kills the fire");
    }
    kernel::signal::ignore(kernel::signal::Signal::Pipe);
}

fn print(s: &FireSummary, exit_code: u8, out: Output) {
    if out.json {
        // The summary and the exit code it leads to.
        let mut value = serde_json::to_value(s).unwrap_or_default();
        value["exit_code"] = exit_code.into();
        let text = serde_json::to_string_pretty(&value).unwrap_or_default();
        cli::outln!("{}", shared::text::printable_json(&text));
        return;
    }
    let line = format!(
        "{} {} {} ({}) report={} receipt={} cards={}{}",
        s.task,
        s.run_id,
        s.status.as_str(),
        s.stop_reason.as_str(),
        s.report.as_deref().unwrap_or("-"),
        s.receipt.as_deref().unwrap_or("-"),
        s.cards.len(),
        s.commit
            .as_deref()
            .map(|c| format!(" commit={}", shared::text::short_id(c)))
            .unwrap_or_default()
    );
    // Cron mails whatever is printed: a success prints only at a terminal, a skip
    // only with -v; everything else says what happened and what to do next.
    let tag = match s.end {
        FireEnd::Completed => {
            if std::io::stdout().is_terminal() {
                cli::outln!("{line}");
            }
            return;
        }
        FireEnd::Skipped => {
            if out.verbose {
                eprintln!("skipped: {} ({})", printable(&s.message), s.task);
            }
            return;
        }
        FireEnd::NeedsAttention => "attention",
        FireEnd::WaitingApproval => "waiting",
        FireEnd::Failed => "error",
        // `main` prints the error and its hint; the records line goes first.
        FireEnd::InvalidInput | FireEnd::Environment | FireEnd::Internal => {
            if s.receipt.is_some() {
                eprintln!("{line}");
            }
            return;
        }
    };
    // The message may quote what a model or a script wrote (an acceptance check's
    // output): every control character escaped (helper-91).
    eprintln!("{tag}: {}", shared::text::printable_multiline(&s.message));
    if s.receipt.is_some() {
        eprintln!("{line}");
    }
    if let Some(hint) = &s.hint {
        eprintln!("hint: {}", printable(hint));
    }
}
