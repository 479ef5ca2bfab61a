//! `builder eval`: run the golden cases of `evals/<task>/*.yaml` on a base and a head
//! revision in one run, each in a temporary worktree, and print them side by side;
//! exit 1 when a head case breaks an assertion or passes less than its `min_pass`.

use crate::command_error::{CommandError, Outcome};
use shared::eval::{self, EvalError, EvalOptions, EvalReport, Revision, TrustedSource};
use std::path::{Path, PathBuf};

/// Run the golden eval cases on a base and a head revision, side by side
///
/// Each revision is checked out into a temporary git worktree (removed afterwards);
/// every case is a real fire there with --no-commit, so nothing is committed and the
/// repository's own .runtime/ state is not touched. Scripted cases answer from their
/// script (offline, deterministic); `model: provider` cases call the settings' model
/// `repeat` times. Uncommitted edits are not evaluated: commit or propose them first.
///
/// Every fire, of base and head alike, runs under the trusted configuration: the
/// base's settings (or --trusted-settings). Its sandbox, network grants, read
/// directories, provider, key variables and telemetry apply, never the revision's own;
/// a revision that would widen one of them is not fired and its rows say why. The
/// fires get only PATH, the locale, a scratch HOME and, for live cases, the trusted
/// key variables from this environment
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The revision to compare against [default: where the head meets the protected
    /// branch; for a commit on that branch itself, its first parent]
    ///
    /// Never the head's own history: a proposal's earlier commit is not a trusted
    /// base. The protected branch is the remote's default branch (its tracking ref,
    /// else the local one), else `main`
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
    /// The revision under test
    #[arg(long, value_name = "REV", default_value = "HEAD")]
    pub head: String,
    /// Only the cases of this task (evals/<TASK>/)
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Print the rows and the summary as JSON
    #[arg(long, conflicts_with = "junit")]
    pub json: bool,
    /// Also write the results as JUnit XML to this file
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Run every fire under this settings file's powers instead of the base's
    ///
    /// An operator's file in the format of settings/runtime.yaml: its sandbox, network,
    /// read directories, provider, key variables and telemetry are what eval fires may
    /// use. Needed when the head has no parent
    #[arg(long, value_name = "FILE")]
    pub trusted_settings: Option<PathBuf>,
    /// The most live model fires (`model: provider` cases times their `repeat`) one
    /// revision may ask for; over it, no live case fires (each spends your provider
    /// account, and a proposal writes its own cases)
    #[arg(long, value_name = "N", default_value_t = shared::eval::DEFAULT_MAX_LIVE_FIRES)]
    pub max_live_fires: u32,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let head_id = super::resolve_commit(&wt.repo, "--head", &args.head)?;
    let base = match &args.base {
        Some(rev) => Some(Revision {
            rev: rev.clone(),
            commit: super::resolve_commit(&wt.repo, "--base", rev)?.to_string(),
        }),
        None => shared::review::base::eval_base(&wt.repo, head_id)?.map(|(name, commit)| Revision {
            rev: name.unwrap_or_else(|| format!("{}^", args.head)),
            commit: commit.to_string(),
        }),
    };
    let head = Revision {
        rev: args.head.clone(),
        commit: head_id.to_string(),
    };
    if let Some(task) = &args.task {
        if !wt.root.join("evals").join(task).is_dir() {
            return Err(
                CommandError::usage(format!("--task {task}: no cases (no directory evals/{task}/)"))
                    .hint("`ls evals` lists the tasks with cases"),
            );
        }
    }
    let trusted = trusted_source(args.trusted_settings);
    let report = evaluate(&wt.root, base, head, args.task, trusted, args.max_live_fires)?;
    if args.json {
        println!(
            "{}",
            shared::text::printable_json(&serde_json::to_string_pretty(&report)?)
        );
    } else {
        print!("{}", shared::text::printable_multiline(&eval::render::text(&report)));
    }
    if let Some(file) = &args.junit {
        std::fs::write(file, eval::render::junit(&report))
            .map_err(|e| CommandError::environment(format!("--junit {}: {e}", file.display())))?;
    }
    Ok(outcome(&report))
}

/// Exit 1 unless every head case passes and every case file loads.
pub fn outcome(report: &EvalReport) -> Outcome {
    if report.summary.ok {
        Outcome::Ok
    } else {
        Outcome::Problems
    }
}

/// Runs the eval of `head` against `base` for the repository at `root`.
pub fn evaluate(
    root: &Path,
    base: Option<Revision>,
    head: Revision,
    task: Option<String>,
    trusted: TrustedSource,
    max_live_fires: u32,
) -> Result<EvalReport, CommandError> {
    let opts = EvalOptions {
        root: root.to_path_buf(),
        base,
        head,
        task,
        runtime: runtime_binary()?,
        trusted,
        max_live_fires,
    };
    eval::evaluate(&opts).map_err(eval_error)
}

/// The trusted configuration `--trusted-settings` names, else the base's.
pub fn trusted_source(file: Option<PathBuf>) -> TrustedSource {
    file.map_or(TrustedSource::Base, TrustedSource::File)
}

/// How an eval that could not run at all is reported.
pub fn eval_error(e: EvalError) -> CommandError {
    match e {
        EvalError::Worktree(_) | EvalError::Io { .. } => CommandError::environment(e.to_string()),
        EvalError::Trusted(_) => CommandError::usage(e.to_string())
            .hint("name the settings whose powers eval fires may use: --trusted-settings FILE (the format of settings/runtime.yaml)"),
    }
}

/// The `runtime` binary that fires the cases (and sandboxes what `builder mcp pin`
/// starts): the one installed beside `builder`, else the first on PATH.
pub fn runtime_binary() -> Result<PathBuf, CommandError> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("runtime")))
        .filter(|p| p.is_file());
    if let Some(p) = beside {
        return Ok(p);
    }
    // Absolute entries only: an empty or relative one would find a branch's own
    // `./runtime` in the repository, which would run unsandboxed as the worker.
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .filter(|d| d.is_absolute())
        .map(|d| d.join("runtime"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CommandError::environment("cannot find the `runtime` binary (beside builder or on PATH): it fires eval cases and sandboxes what `builder mcp pin` starts")
                .hint("install runtime next to builder, or put it on PATH")
        })
}
