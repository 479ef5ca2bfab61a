//! The fire's configuration, resolved once: settings narrowed by the task's prompt
//! (tools, budgets, deny rules), the policy, the limits and output caps, the provider
//! ports and retry policy, the runtime identity and the redactor. Every later phase
//! reads this one value, the way ripgrep turns low-level arguments into high-level
//! ones before doing any work.

use crate::layout::STATE_DIR;
use crate::policy::{Policy, PolicyError};
use crate::prompt::Prompt;
use crate::provider::{provider_port, RetryPolicy};
use crate::secrets::Redactor;
use crate::settings::{Budgets, Identity, Limits, RuntimeSettings};
use crate::telemetry::Exporter;
use std::path::{Path, PathBuf};

/// Output kept from an acceptance script: enough for the failure's detail.
pub const ACCEPTANCE_OUTPUT_BYTES: usize = 4096;

/// Everything a fire needs to know after loading its inputs.
pub struct FireConfig {
    pub settings: RuntimeSettings,
    pub prompt: Prompt,
    /// The boundary document, appended to the system prompt.
    pub scope: String,
    pub policy: Policy,
    /// The tools this task may use (the settings' list narrowed by the prompt).
    pub tools: Vec<crate::tools::Tool>,
    /// The settings' budgets narrowed by the prompt.
    pub budgets: Budgets,
    pub limits: Limits,
    pub redactor: Redactor,
    /// TCP ports of the primary and fallback providers (the runtime's sandbox).
    pub provider_ports: Vec<u16>,
    pub retry: RetryPolicy,
    pub identity: Identity,
    /// Where the fire's trace is exported when it ends, if anywhere.
    pub telemetry: Option<Exporter>,
    /// This run's private scratch directory.
    pub scratch: PathBuf,
    /// Where the committed `tools/` was written out (repo-relative, holding `tools/`;
    /// one copy per `tools/` tree, reused), when the task runs scripts: they run from
    /// there.
    pub tools_dir: Option<PathBuf>,
}

impl FireConfig {
    /// Resolves the configuration of a run from loaded settings, prompt and scope.
    /// Fails only when the permissions do not compile into a policy.
    pub fn resolve(
        root: &Path,
        scratch: PathBuf,
        settings: RuntimeSettings,
        prompt: Prompt,
        scope: String,
    ) -> Result<FireConfig, PolicyError> {
        let mut perms = settings.permissions.clone();
        perms.deny.extend(prompt.front.deny.iter().cloned());
        let policy = Policy::new(root, &perms, &settings.builder_paths)?.with_scratch(&scratch);
        let provider_ports = [Some(&settings.provider), settings.fallback.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(provider_port)
            .collect();
        Ok(FireConfig {
            tools: prompt.tools(&settings),
            budgets: prompt.budgets(&settings),
            limits: settings.limits,
            redactor: redactor(Some(&settings)),
            retry: RetryPolicy::from_limits(&settings.limits),
            identity: settings.runtime_identity.clone(),
            telemetry: exporter(Some(&settings)),
            provider_ports,
            scratch,
            tools_dir: None,
            policy,
            prompt,
            scope,
            settings,
        })
    }

    /// The TCP ports the runtime's own sandbox may connect to: the providers' and the
    /// OTLP endpoint's (the export happens inside the sandbox, at the end of the fire),
    /// and those of `url:` MCP servers.
    pub fn connect_ports(&self) -> Vec<u16> {
        let mut ports = self.provider_ports.clone();
        ports.extend(self.telemetry.as_ref().and_then(Exporter::port));
        // `url:` MCP servers: the runtime opens their sessions.
        ports.extend(
            self.settings
                .mcp
                .values()
                .filter_map(|s| s.endpoint()?.port_or_known_default()),
        );
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

/// The per-run scratch directory under the runtime's state directory. Its name is
/// random, not the run id: it is the `HOME` of model-run commands, and a model that
/// knew its run id could aim at the run's record names before they exist.
pub fn scratch_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
        .join("scratch")
        .join(format!("s-{:016x}", rand::random::<u64>()))
}

impl FireConfig {
    /// The path a builder script `script` (`tools/...`) runs from: its committed copy
    /// when the tools were written out for this run, else the work tree's.
    pub fn script_path(&self, script: &str) -> String {
        match &self.tools_dir {
            Some(dir) => dir.join(script).to_string_lossy().into_owned(),
            None => script.to_string(),
        }
    }
}

/// The one way a fire finds its OTLP exporter: the settings' `telemetry` section (none
/// when the settings could not be read) under the environment's
/// `OTEL_EXPORTER_OTLP_ENDPOINT`. An unusable endpoint is a warning: telemetry never
/// fails a fire.
pub fn exporter(settings: Option<&RuntimeSettings>) -> Option<Exporter> {
    let telemetry = settings.map(|s| s.telemetry.clone()).unwrap_or_default();
    Exporter::from_env(&telemetry).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "OpenTelemetry export is off");
        None
    })
}

/// The one way a fire builds its redactor: the key variables the settings name (both
/// providers), or none when the settings could not be read. Log lines are redacted
/// of the same values from here on ([`crate::secrets::redact_in_logs`]).
pub fn redactor(settings: Option<&RuntimeSettings>) -> Redactor {
    let keys = settings
        .into_iter()
        .flat_map(|s| [Some(&s.provider), s.fallback.as_ref()])
        .flatten()
        .filter_map(|p| p.api_key_env.as_deref());
    // The tokens the runtime sends to `url:` MCP servers are secrets of the same kind,
    // and so is every variable it hands a stdio server (`env_allow`: its credentials,
    // its database's address) but the system's own ([`crate::mcp::config::McpServer::secret_vars`]): a
    // server that echoes one into a result or its error output must not bring it to
    // the model, a card or git.
    let tokens = settings
        .into_iter()
        .flat_map(|s| s.mcp.values())
        .flat_map(|m| m.secret_vars());
    let redactor = Redactor::from_env(keys.chain(tokens));
    crate::secrets::redact_in_logs(&redactor);
    redactor
}
