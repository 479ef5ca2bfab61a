//! `runtime fire --dry-run`: everything a fire resolves before its first model call
//! (settings, policy, tools, prefetch output, and the first request exactly as the
//! provider would send it, with the key redacted), through the fire's own code, but
//! no lock, no model call, no record and no commit. The binary prints the result.

use super::prepare::prepare_dry;
use super::{FireEnd, FireOptions, FireSummary};
use crate::agent;
use crate::layout::SETTINGS_FILE;
use crate::provider::WireRequest;
use crate::records::RunStatus;
use crate::settings::{Budgets, LandlockMode, NetworkSetting, Permissions, ProviderSettings};
use crate::trace::BudgetReport;
use serde::Serialize;

/// What a fire of the task would run with, and what it would send first.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    pub task: String,
    pub settings_file: String,
    pub prompt_file: String,
    pub provider: ProviderView,
    pub fallback: Option<ProviderView>,
    /// The model the loop asks (the prompt's `model:`, else the provider's).
    pub model: String,
    pub budgets: Budgets,
    pub landlock: LandlockMode,
    pub network: NetworkSetting,
    /// The effective rules: the settings' permissions with the prompt's deny rules.
    pub permissions: Permissions,
    pub tools: Vec<crate::tools::Tool>,
    /// The prefetch output appended to the task prompt (markdown; empty for none).
    pub prefetch: String,
    /// How the first conversation fits the model's context.
    pub context: BudgetReport,
    /// The first request as sent, key redacted; `None` for `replay` (sends nothing).
    pub request: Option<WireRequest>,
    /// What a fire would refuse or warn about that a dry run only reports.
    pub notes: Vec<String>,
}

/// One configured provider, as a person needs to see it (never the key itself).
#[derive(Debug, Clone, Serialize)]
pub struct ProviderView {
    pub kind: String,
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The variable the key is read from.
    pub api_key_env: Option<String>,
}

impl ProviderView {
    fn of(s: &ProviderSettings) -> ProviderView {
        ProviderView {
            kind: format!("{:?}", s.kind).to_lowercase(),
            model: s.model.clone(),
            base_url: s.base_url.clone().or_else(|| s.replay.clone()),
            api_key_env: s.api_key_env.clone(),
        }
    }
}

/// Resolves a fire of `opts.task` without running it. `Err` is the summary of what
/// stopped it (a configuration problem maps to the usual exit 2), with nothing written.
pub fn dry_run(opts: FireOptions) -> Result<DryRun, Box<FireSummary>> {
    let (run, dry) = prepare_dry(opts)?;
    let result = (|| {
        let chain = run.providers().map_err(|e| {
            let why = run.config.redactor.redact(&e.to_string()).into_owned();
            Box::new(run.ctx.unrecorded(
                RunStatus::Failed,
                FireEnd::InvalidInput,
                format!("provider could not be set up: {why}"),
            ))
        })?;
        let cfg = run.loop_config(&chain);
        let defs = agent::tool_defs(&cfg.tools);
        let (req, context) = agent::model_request(&cfg, &run.state.messages, &defs);
        let request = chain.primary.redacted_request(&req).map(|mut wire| {
            // The body carries only repository text, already redacted where it came
            // from a script; redact once more so no key variable's value can show.
            let text = run.config.redactor.redact(&wire.body.to_string()).into_owned();
            if let Ok(body) = serde_json::from_str(&text) {
                wire.body = body;
            }
            wire
        });
        let s = &run.config.settings;
        let mut permissions = s.permissions.clone();
        permissions.deny.extend(run.config.prompt.front.deny.iter().cloned());
        Ok(DryRun {
            task: run.ctx.opts.task.clone(),
            settings_file: SETTINGS_FILE.to_string(),
            prompt_file: run.config.prompt.file.to_string_lossy().into_owned(),
            provider: ProviderView::of(&s.provider),
            fallback: s.fallback.as_ref().map(ProviderView::of),
            model: cfg.model.clone(),
            budgets: run.config.budgets,
            landlock: s.sandbox.landlock,
            network: s.sandbox.network.clone(),
            permissions,
            tools: run.config.tools.clone(),
            prefetch: dry.prefetched,
            context,
            request,
            notes: dry.notes,
        })
    })();
    let _ = std::fs::remove_dir_all(&run.config.scratch);
    result
}
