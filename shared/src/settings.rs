//! Typed, validated settings: `settings/runtime.yaml` (docs/design.md) plus any
//! Claude Code style `settings/*.json` whose `permissions` block is merged in, so a
//! team moving off `claude -p --settings settings.json` keeps its file. Loading
//! rejects unknown keys and wrong types and then checks meaning (rules parse, globs
//! compile, tools exist, the write ACL stays clear of builder paths), collecting every
//! problem as a [`Diagnostic`] with file, line and field.
//!
//! Settings are plain data plus their validation, low in the crate: this module
//! imports only `diag`, `layout`, `yamlpos` and the rule grammar `rules`. The arrow
//! points from the policy engine to settings (the engine reads [`Permissions`] and
//! [`DefaultDecision`]), never back: checking that a rule parses needs the grammar, not
//! the engine, so the grammar is a leaf both use, and the ownership question "could
//! this write glob reach a builder path" is answered by `layout`, like every other.

use crate::diag::{Diagnostic, Diagnostics};
use crate::layout::{overlapping_builder_dir, SETTINGS_FILE};
use crate::rules::Rule;
use crate::tools::Tool;
use crate::yamlpos;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `settings/runtime.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSettings {
    pub version: u32,
    pub provider: ProviderSettings,
    #[serde(default)]
    pub fallback: Option<ProviderSettings>,
    #[serde(default)]
    pub permissions: Permissions,
    #[serde(default)]
    pub sandbox: SandboxSettings,
    #[serde(default)]
    pub budgets: Budgets,
    #[serde(default = "default_tools")]
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub runtime_identity: Identity,
    /// Extra builder-owned paths (globs, repo-relative).
    #[serde(default)]
    pub builder_paths: Vec<String>,
    /// Price per model, USD per million tokens.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    #[serde(default)]
    pub limits: Limits,
    /// How durable the run's checkpoints and records are before the fire goes on.
    #[serde(default)]
    pub durability: Durability,
    /// OpenTelemetry export of each fire's trace (optional).
    #[serde(default)]
    pub telemetry: Telemetry,
    /// Fire only when HEAD's tree of builder-owned paths has an approval on
    /// `refs/builder/approvals`; `builder audit` then calls an unapproved change a
    /// violation, not a warning (docs/design.md).
    #[serde(default)]
    pub require_reviewed: bool,
    /// How approvals are checked (optional).
    #[serde(default)]
    pub review: ReviewSettings,
    /// The cron box (optional): fetch, fast-forward to an approved tip, push records.
    #[serde(default)]
    pub sync: Option<SyncSettings>,
    /// MCP tool servers, run inside the tool sandbox (optional; see `crate::mcp`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp: crate::mcp::McpServers,
}

/// The `sync:` section (docs/design.md): the remote and branch a fire
/// fetches before and pushes after, and how often a rejected push is rebuilt on the
/// remote's new tip and tried again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SyncSettings {
    /// A remote configured in the repository (`git remote`).
    pub remote: String,
    /// The branch fetched, fast-forwarded and pushed.
    pub branch: String,
    /// Pushes tried per fire (the first and the retries after a rejection), 1 to 20.
    #[serde(default = "default_push_attempts")]
    pub push_attempts: u32,
}

fn default_push_attempts() -> u32 {
    5
}

/// The `review:` section: with `require_signed`, approvals count only with an SSH
/// signature by a key in `allowed_signers` (see `review::signing`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewSettings {
    /// Approvals count only with an SSH signature from `allowed_signers`.
    pub require_signed: bool,
    /// git's allowed-signers file: repo-relative (builder-owned, read from the tree
    /// trusted before the one judged), or absolute (an operator's file, the only list).
    pub allowed_signers: Option<String>,
}

impl RuntimeSettings {
    /// The first key variable the settings name (primary, then fallback) that is unset
    /// or empty in this process's environment: a fire without its key would only fail
    /// at the first request, so it refuses before sending one.
    pub fn missing_key_variable(&self) -> Option<&str> {
        [Some(&self.provider), self.fallback.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.api_key_env.as_deref())
            .find(|var| std::env::var_os(var).is_none_or(|v| v.is_empty()))
    }
}

fn default_tools() -> Vec<Tool> {
    Tool::ALL.to_vec()
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Replay,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    pub kind: ProviderKind,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Name of the environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Recorded trace for `kind: replay` (repo-relative).
    #[serde(default)]
    pub replay: Option<String>,
    /// The model's context window, in tokens.
    #[serde(default)]
    pub max_context_tokens: Option<u64>,
}

impl ProviderSettings {
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(match self.kind {
            ProviderKind::Replay => "replay",
            ProviderKind::Openai | ProviderKind::Anthropic => "unknown",
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum DefaultDecision {
    #[default]
    Deny,
    Ask,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub ask: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// The write ACL: globs, repo-relative. Never a builder path.
    #[serde(default)]
    pub write: Vec<String>,
    /// What a call that matches no rule gets in a fire.
    #[serde(default)]
    pub default: DefaultDecision,
    /// Extra read roots outside the repository (absolute paths).
    #[serde(default, alias = "additionalDirectories")]
    pub additional_directories: Vec<String>,
}

/// How durable the runtime's own writes are (`durability:`): what survives a crash of
/// the process, or a power loss too.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// SQLite WAL with `synchronous=NORMAL`; records renamed into place without an
    /// fsync. Survives a crash of the process (SIGKILL, the OOM killer), not a power
    /// loss: the last checkpoints before one may be lost.
    #[default]
    Normal,
    /// `synchronous=FULL` for the run's row, checkpoints and tool ledger; each record
    /// fsynced before its rename and its directory after.
    Strict,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether writes are fsynced before the fire goes on.
    pub fn fsyncs(self) -> bool {
        match self {
            Durability::Normal => false,
            Durability::Strict => true,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LandlockMode {
    #[default]
    Required,
    BestEffort,
    Off,
}

/// Network access for model-run commands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum NetworkSetting {
    Mode(NetworkMode),
    Ports(Vec<u16>),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    None,
    Provider,
}

impl Default for NetworkSetting {
    fn default() -> Self {
        NetworkSetting::Mode(NetworkMode::Provider)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SandboxSettings {
    #[serde(default)]
    pub landlock: LandlockMode,
    #[serde(default)]
    pub network: NetworkSetting,
    /// The most bytes a tool worker's processes may write in all (scratch and write
    /// directories together): one tmpfs of this size holds it, and only what it holds
    /// is copied into the repository (docs/sandbox.md).
    #[serde(default = "default_write_bytes")]
    pub write_bytes: u64,
}
impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            landlock: LandlockMode::default(),
            network: NetworkSetting::default(),
            write_bytes: default_write_bytes(),
        }
    }
}
/// 256 MiB: room for reports, a build or a package cache in the scratch, and far less
/// than a host disk.
fn default_write_bytes() -> u64 {
    256 * 1024 * 1024
}
/// The smallest `sandbox.write_bytes`: a tmpfs needs a few pages for its directories.
pub const MIN_WRITE_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    #[serde(default = "d_steps")]
    pub max_steps: u32,
    #[serde(default = "d_wall")]
    pub max_wall_s: u64,
    #[serde(default = "d_tokens")]
    pub max_tokens: u64,
    #[serde(default = "d_cost")]
    pub max_cost_usd: f64,
}
fn d_steps() -> u32 {
    20
}
fn d_wall() -> u64 {
    300
}
fn d_tokens() -> u64 {
    200_000
}
fn d_cost() -> f64 {
    0.5
}
impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            max_steps: d_steps(),
            max_wall_s: d_wall(),
            max_tokens: d_tokens(),
            max_cost_usd: d_cost(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub name: String,
    pub email: String,
    /// An SSH private key on the box (absolute, or `~/`): the runtime signs its
    /// commits with it (SSHSIG, namespace `builder-runtime`, in the commit's `gpgsig`
    /// header), and `builder audit` then flags runtime-named commits without a valid
    /// signature by a key the allowed-signers file lists for the runtime's email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key: Option<String>,
}
impl Default for Identity {
    fn default() -> Self {
        Identity {
            name: "runtime".into(),
            email: "runtime@localhost".into(),
            signing_key: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// Operational limits; every field has a sensible default.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub request_timeout_s: u64,
    pub max_retries: u32,
    /// First retry delay; doubles with each retry (with jitter).
    pub retry_base_ms: u64,
    pub tool_timeout_s: u64,
    pub tool_output_bytes: usize,
    pub prefetch_timeout_s: u64,
    /// Denied calls tolerated before the fire stops as `permission_denied`.
    pub max_denials: u32,
    /// Identical consecutive calls before `repeated_call`.
    pub repeated_call: u32,
    /// Identical consecutive failures before `repeated_error`.
    pub repeated_error: u32,
    /// The most tokens one model response may use (the request's output cap).
    pub max_output_tokens: u32,
    /// After the primary provider fails and the fallback answers, the rest of the
    /// fire's calls go to the fallback for this long before the primary is tried again.
    pub fallback_cooldown_s: u64,
    /// The largest file the model may leave under `reports/` and still see committed.
    pub output_file_bytes: u64,
    /// The most bytes of model-written files one fire commits.
    pub output_total_bytes: u64,
    /// The most model-written files one fire commits.
    pub output_files: usize,
    /// How long after its last checkpoint an interrupted run is resumed by the next
    /// fire of its task (on the same inputs); older ones are closed as `crashed`.
    pub resume_window_s: u64,
    /// The most bytes of one model response body read; a longer one (a server that
    /// streams without end) fails the call as a provider error.
    pub provider_response_bytes: u64,
}
impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout_s: 60,
            max_retries: 3,
            retry_base_ms: 500,
            tool_timeout_s: 30,
            tool_output_bytes: 64 * 1024,
            prefetch_timeout_s: 30,
            max_denials: 3,
            repeated_call: 3,
            repeated_error: 3,
            max_output_tokens: 4096,
            fallback_cooldown_s: 300,
            output_file_bytes: 1024 * 1024,
            output_total_bytes: 8 * 1024 * 1024,
            output_files: 64,
            resume_window_s: 3600,
            provider_response_bytes: 16 * 1024 * 1024,
        }
    }
}

/// OpenTelemetry: where each fire's trace goes over OTLP/HTTP, and whether message and
/// tool content go with it. `OTEL_EXPORTER_OTLP_ENDPOINT` in the fire's environment
/// overrides `endpoint`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// OTLP/HTTP base URL (`http://127.0.0.1:4318`); traces go to `{endpoint}/v1/traces`.
    pub endpoint: Option<String>,
    /// Export prompts, model output and tool results too (off: names, ids, tokens only).
    pub include_content: bool,
}

/// A rule together with where it was written, for diagnostics and receipts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSource {
    pub file: PathBuf,
    pub line: usize,
}

/// Settings after loading every source: runtime.yaml with the JSON permissions merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub runtime: RuntimeSettings,
    /// Claude Code style files that contributed permissions.
    pub json_sources: Vec<PathBuf>,
}

const TOP_KEYS: &[&str] = &[
    "version",
    "provider",
    "fallback",
    "permissions",
    "sandbox",
    "budgets",
    "tools",
    "runtime_identity",
    "builder_paths",
    "prices",
    "limits",
    "durability",
    "telemetry",
    "require_reviewed",
    "review",
    "sync",
    "mcp",
];

/// Claude Code settings keys that are accepted and ignored (they configure the
/// interactive CLI, not a headless fire). Anything else is an unknown key.
const CLAUDE_IGNORED_KEYS: &[&str] = &[
    "$schema",
    "env",
    "hooks",
    "model",
    "apiKeyHelper",
    "cleanupPeriodDays",
    "includeCoAuthoredBy",
    "statusLine",
    "outputStyle",
    "enableAllProjectMcpServers",
    "enabledMcpjsonServers",
    "disabledMcpjsonServers",
    "forceLoginMethod",
    "spinnerTipsEnabled",
    "alwaysThinkingEnabled",
];

/// Where settings files are read from: the work tree ([`WorkTreeFiles`], what
/// `builder check` and the builder's commands lint) or a commit's tree (what a fire
/// runs on: the approved bytes, never a path through a link in the work tree).
pub trait SettingsSource {
    /// The text of the repo-relative file `rel`, or why it cannot be read.
    fn read_text(&self, rel: &Path) -> Result<String, String>;
    /// The Claude Code style `settings/*.json` files, repo-relative, sorted.
    fn json_files(&self) -> Vec<PathBuf>;
}

/// The settings files of the work tree at a root.
pub struct WorkTreeFiles<'a>(pub &'a Path);

impl SettingsSource for WorkTreeFiles<'_> {
    fn read_text(&self, rel: &Path) -> Result<String, String> {
        crate::regular::read_text_within(self.0, rel).map_err(|e| e.to_string())
    }

    fn json_files(&self) -> Vec<PathBuf> {
        json_files(self.0)
            .into_iter()
            .map(|p| p.strip_prefix(self.0).map(Path::to_path_buf).unwrap_or(p))
            .collect()
    }
}

/// Loads and validates every settings source of the repository at `root` (its work
/// tree).
pub fn load(root: &Path) -> Result<Settings, Diagnostics> {
    load_from(&WorkTreeFiles(root))
}

/// Loads and validates every settings source `src` holds.
pub fn load_from(src: &dyn SettingsSource) -> Result<Settings, Diagnostics> {
    let mut diags = Vec::new();
    match lint_from(src, &mut diags).settings {
        Some(settings) => Ok(settings),
        None => {
            if diags.is_empty() {
                diags.push(Diagnostic::new(SETTINGS_FILE, 0, "", "settings could not be loaded"));
            }
            Err(Diagnostics(diags))
        }
    }
}

/// Every settings source of a repository read once: what [`load`] returns when all
/// of them load, plus what `builder check` lints the rest of the repository with.
pub struct Linted {
    /// The merged settings, when every source loaded without a problem.
    pub settings: Option<Settings>,
    /// `settings/runtime.yaml` with broken sections replaced by defaults (so prompts
    /// can still be checked against them). `None` only when the file is missing or
    /// not YAML.
    pub lenient: Option<Lenient>,
    /// The text of `settings/runtime.yaml`, for line numbers (empty when unreadable).
    pub runtime_src: String,
}

/// Reads and checks every settings source once, every problem into `diags`
/// (runtime.yaml's first, then each JSON file's).
pub fn lint(root: &Path, diags: &mut Vec<Diagnostic>) -> Linted {
    lint_from(&WorkTreeFiles(root), diags)
}

/// [`lint`] of the files `src` holds.
pub fn lint_from(src: &dyn SettingsSource, diags: &mut Vec<Diagnostic>) -> Linted {
    let before = diags.len();
    let (runtime_src, lenient) = match src.read_text(Path::new(SETTINGS_FILE)) {
        Ok(src) => {
            let lenient = parse_best_effort(&src, diags);
            (src, lenient)
        }
        Err(e) => {
            diags.push(
                Diagnostic::new(SETTINGS_FILE, 0, "", format!("cannot read: {e}"))
                    .with_hint("run `builder init` to scaffold settings/runtime.yaml"),
            );
            (String::new(), None)
        }
    };
    let mut json_sources = Vec::new();
    let mut json_perms = Vec::new();
    for rel in src.json_files() {
        if let Some(p) = load_claude_json(src.read_text(&rel), &rel, diags) {
            json_perms.push(p);
            json_sources.push(rel);
        }
    }
    let settings = match &lenient {
        Some(l) if diags.len() == before => {
            let mut runtime = l.settings.clone();
            for p in json_perms {
                runtime.permissions.allow.extend(p.allow);
                runtime.permissions.ask.extend(p.ask);
                runtime.permissions.deny.extend(p.deny);
                runtime
                    .permissions
                    .additional_directories
                    .extend(p.additional_directories);
            }
            Some(Settings { runtime, json_sources })
        }
        _ => None,
    };
    Linted {
        settings,
        lenient,
        runtime_src,
    }
}

fn json_files(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("settings"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Parses and validates runtime settings from YAML text (file name for diagnostics is
/// always `settings/runtime.yaml`).
pub fn parse_runtime_yaml(src: &str, diags: &mut Vec<Diagnostic>) -> Option<RuntimeSettings> {
    let before = diags.len();
    let best_effort = parse_best_effort(src, diags);
    if diags.len() > before {
        None
    } else {
        best_effort.map(|l| l.settings)
    }
}

/// Settings loaded for linting, and which top-level sections are stand-ins (defaults
/// or placeholders) because the file's own did not load.
pub struct Lenient {
    pub settings: RuntimeSettings,
    pub stand_ins: Vec<String>,
}

fn parse_best_effort(src: &str, diags: &mut Vec<Diagnostic>) -> Option<Lenient> {
    let file = Path::new(SETTINGS_FILE);
    if let Some(why) = crate::yamlpos::too_many_flow_openings(src.as_bytes()) {
        diags.push(Diagnostic::new(file, 0, "", why));
        return None;
    }
    let value: serde_yaml::Value = match serde_yaml::from_str(src) {
        Ok(v) => v,
        Err(e) => {
            let (line, what) = crate::yamlpos::syntax_error(src, &e);
            diags.push(Diagnostic::new(file, line, "", format!("YAML syntax error: {what}")));
            return None;
        }
    };
    let mut failed = sections_that_fail(file, src, &value, diags);
    let map = value.as_mapping()?;
    // Keep checking meaning in the sections that did parse: drop the broken ones (their
    // defaults stand in) so one typo does not hide every other problem.
    let mut kept = serde_yaml::Mapping::new();
    let mut unknown_tools = Vec::new();
    for (k, v) in map {
        if k.as_str()
            .is_some_and(|k| TOP_KEYS.contains(&k) && !failed.iter().any(|f| f == k))
        {
            let mut v = v.clone();
            if k.as_str() == Some("tools") {
                unknown_tools = take_unknown_tools(&mut v);
            }
            kept.insert(k.clone(), v);
        }
    }
    for (key, stand_in) in [("version", "1"), ("provider", "{kind: replay, replay: stand-in}")] {
        if !kept.contains_key(key) {
            if !map.contains_key(key) {
                diags.push(Diagnostic::new(file, 1, key, format!("missing required key `{key}`")));
            }
            failed.push(key.to_string());
            kept.insert(key.into(), serde_yaml::from_str(stand_in).unwrap_or_default());
        }
    }
    let settings: RuntimeSettings = match serde_path_to_error::deserialize(serde_yaml::Value::Mapping(kept)) {
        Ok(s) => s,
        Err(e) => {
            let field = e.path().to_string();
            diags.push(Diagnostic::new(
                file,
                line_for_field(src, &field),
                field,
                e.inner().to_string(),
            ));
            return None;
        }
    };
    let unknown_tools: Vec<String> = unknown_tools.into_iter().map(|(_, name)| name).collect();
    diags.extend(validate(&settings, src, &unknown_tools).into_iter().filter(|d| {
        let top = d.field.split('.').next().unwrap_or("");
        !failed.iter().any(|f| f == top)
    }));
    Some(Lenient {
        settings,
        stand_ins: failed,
    })
}

/// Type-checks each top-level section of `value` on its own (diagnostics into
/// `diags`); returns the keys of the sections that did not load.
fn sections_that_fail(file: &Path, src: &str, value: &serde_yaml::Value, diags: &mut Vec<Diagnostic>) -> Vec<String> {
    let mut failed: Vec<String> = Vec::new();
    check_sections(file, src, value, TOP_KEYS, diags, |key, v, diags| {
        let n = diags.len();
        match key {
            "version" => section::<u32>(file, src, key, v, diags),
            "provider" | "fallback" => section::<ProviderSettings>(file, src, key, v, diags),
            "permissions" => section::<Permissions>(file, src, key, v, diags),
            "sandbox" => section::<SandboxSettings>(file, src, key, v, diags),
            "budgets" => section::<Budgets>(file, src, key, v, diags),
            "tools" | "builder_paths" => section::<Vec<String>>(file, src, key, v, diags),
            "runtime_identity" => section::<Identity>(file, src, key, v, diags),
            "prices" => section::<BTreeMap<String, Price>>(file, src, key, v, diags),
            "limits" => section::<Limits>(file, src, key, v, diags),
            "durability" => section::<Durability>(file, src, key, v, diags),
            "telemetry" => section::<Telemetry>(file, src, key, v, diags),
            "require_reviewed" => section::<bool>(file, src, key, v, diags),
            "review" => section::<ReviewSettings>(file, src, key, v, diags),
            "sync" => section::<SyncSettings>(file, src, key, v, diags),
            "mcp" => section::<crate::mcp::McpServers>(file, src, key, v, diags),
            _ => {}
        }
        if diags.len() > n {
            failed.push(key.to_string());
        }
    });
    failed
}

/// Checks the top level is a mapping with only known keys, then hands each known key
/// to `each` so every section is type-checked on its own and all errors surface.
pub(crate) fn check_sections(
    file: &Path,
    src: &str,
    value: &serde_yaml::Value,
    known: &[&str],
    diags: &mut Vec<Diagnostic>,
    mut each: impl FnMut(&str, &serde_yaml::Value, &mut Vec<Diagnostic>),
) {
    let Some(map) = value.as_mapping() else {
        diags.push(Diagnostic::new(
            file,
            1,
            "",
            "expected a mapping of keys at the top level",
        ));
        return;
    };
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            diags.push(Diagnostic::new(
                file,
                1,
                "",
                format!("expected string keys, found {k:?}"),
            ));
            continue;
        };
        if known.contains(&key) {
            each(key, v, diags);
        } else {
            diags.push(
                Diagnostic::new(file, yamlpos::line_of(src, &[key]), key, "unknown key")
                    .with_hint(format!("expected one of: {}", known.join(", "))),
            );
        }
    }
}

/// Type-checks one top-level section, recording a diagnostic on failure.
pub(crate) fn section<T: DeserializeOwned>(
    file: &Path,
    src: &str,
    key: &str,
    v: &serde_yaml::Value,
    diags: &mut Vec<Diagnostic>,
) {
    if let Err(e) = serde_path_to_error::deserialize::<_, T>(v.clone()) {
        let inner = e.inner().to_string();
        let sub = e.path().to_string();
        let mut field = if sub == "." {
            key.to_string()
        } else {
            format!("{key}.{sub}")
        };
        // For unknown fields point at the offending key, not its parent.
        if let Some(name) = inner.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
            if !field.ends_with(name) {
                field = format!("{field}.{name}");
            }
        }
        let line = line_for_field(src, &field);
        let hint = if inner.starts_with("unknown field") {
            Some("remove it or check its spelling")
        } else {
            None
        };
        let mut d = Diagnostic::new(file, line, field, inner);
        if let Some(h) = hint {
            d = d.with_hint(h);
        }
        diags.push(d);
    }
}

fn line_for_field(src: &str, field: &str) -> usize {
    let segs: Vec<&str> = field
        .split('.')
        .map(|s| s.split('[').next().unwrap_or(s))
        .filter(|s| !s.is_empty() && s.parse::<usize>().is_err())
        .collect();
    yamlpos::line_of(src, &segs)
}

/// Takes the names that are not a [`Tool`] out of a `tools:` list, so the rest
/// deserializes into tools; returns each name taken with its index in the list, for the
/// caller to report. A value that is not a list of strings is left for the type check.
pub(crate) fn take_unknown_tools(list: &mut serde_yaml::Value) -> Vec<(usize, String)> {
    let Some(seq) = list.as_sequence_mut() else {
        return Vec::new();
    };
    if !seq.iter().all(serde_yaml::Value::is_string) {
        return Vec::new();
    }
    let mut unknown = Vec::new();
    let mut i = 0;
    seq.retain(|v| {
        let name = v.as_str().unwrap_or_default();
        let known = Tool::from_name(name).is_some();
        if !known {
            unknown.push((i, name.to_string()));
        }
        i += 1;
        known
    });
    unknown
}

/// The diagnostic for a `tools:` entry that names no tool.
pub(crate) fn unknown_tool(file: &Path, line: usize, name: &str) -> Diagnostic {
    Diagnostic::new(file, line, "tools", format!("unknown tool `{name}`"))
        .with_hint(format!("known tools: {}", Tool::names()))
}

/// Semantic checks on type-correct settings; `unknown_tools` are the `tools:` entries
/// that named no tool (taken out before the list deserialized).
pub fn validate(s: &RuntimeSettings, src: &str, unknown_tools: &[String]) -> Vec<Diagnostic> {
    let file = Path::new(SETTINGS_FILE);
    let mut d = Vec::new();
    if s.version != 1 {
        d.push(Diagnostic::new(
            file,
            yamlpos::line_of(src, &["version"]),
            "version",
            format!("unsupported version {}, expected 1", s.version),
        ));
    }
    for (key, p) in [("provider", Some(&s.provider)), ("fallback", s.fallback.as_ref())] {
        let Some(p) = p else { continue };
        validate_provider(file, src, key, p, &mut d);
    }
    review_problems(file, src, &s.review, &mut d);
    if let Some(sync) = &s.sync {
        sync_problems(file, src, sync, &mut d);
    }
    if s.sandbox.write_bytes < MIN_WRITE_BYTES {
        d.push(Diagnostic::new(
            file,
            yamlpos::line_of(src, &["sandbox", "write_bytes"]),
            "sandbox.write_bytes",
            format!(
                "{} is too small: at least {MIN_WRITE_BYTES} bytes (1 MiB)",
                s.sandbox.write_bytes
            ),
        ));
    }
    permission_problems(file, src, &s.permissions, &mut d);
    let keys: Vec<&str> = [Some(&s.provider), s.fallback.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|p| p.api_key_env.as_deref())
        .collect();
    crate::mcp::config::validate(file, src, &s.mcp, &keys, &mut d);
    builder_path_problems(file, src, s, &mut d);
    identity_problems(file, src, &s.runtime_identity, &mut d);
    for t in unknown_tools {
        d.push(unknown_tool(file, yamlpos::line_of_item(src, &["tools"], t), t));
    }
    budget_problems(file, src, &s.budgets, &mut d);
    telemetry_problems(file, src, &s.telemetry, &mut d);
    for dir in &s.permissions.additional_directories {
        if !Path::new(dir).is_absolute() && !dir.starts_with("~/") {
            d.push(Diagnostic::new(
                file,
                yamlpos::line_of_item(src, &["permissions"], dir),
                "permissions.additional_directories",
                format!("`{dir}` must be an absolute path"),
            ));
        }
    }
    d
}

/// `review.allowed_signers` names a file inside the repository or an absolute one.
fn review_problems(file: &Path, src: &str, review: &ReviewSettings, d: &mut Vec<Diagnostic>) {
    if let Some(p) = &review.allowed_signers {
        if p.is_empty() || (!Path::new(p).is_absolute() && p.split('/').any(|c| c == "..")) {
            d.push(Diagnostic::new(
                file,
                yamlpos::line_of(src, &["review", "allowed_signers"]),
                "review.allowed_signers",
                format!("`{p}` must be a repo-relative path inside the repository (builder-owned, e.g. settings/allowed_signers) or an absolute path to the operator's own file"),
            ));
        }
    }
}

/// The sync section names a remote, a short branch and a sane number of pushes.
fn sync_problems(file: &Path, src: &str, sync: &SyncSettings, d: &mut Vec<Diagnostic>) {
    let line = |k: &str| yamlpos::line_of(src, &["sync", k]);
    if sync.remote.trim().is_empty() || sync.remote.starts_with('-') {
        d.push(Diagnostic::new(
            file,
            line("remote"),
            "sync.remote",
            format!("`{}` is not a remote name", sync.remote),
        ));
    }
    if !git2::Branch::name_is_valid(&sync.branch).unwrap_or(false) || sync.branch.starts_with("refs/") {
        d.push(
            Diagnostic::new(
                file,
                line("branch"),
                "sync.branch",
                format!("`{}` is not a branch name", sync.branch),
            )
            .with_hint("a short branch name such as `main`"),
        );
    } else if sync.branch.starts_with(crate::layout::PROPOSAL_PREFIX) {
        d.push(
            Diagnostic::new(
                file,
                line("branch"),
                "sync.branch",
                format!(
                    "`{}` is a proposal's branch: a proposal cannot be the branch it is reviewed against",
                    sync.branch
                ),
            )
            .with_hint("the branch the box fires from, such as `main`"),
        );
    }
    if !(1..=20).contains(&sync.push_attempts) {
        d.push(Diagnostic::new(
            file,
            line("push_attempts"),
            "sync.push_attempts",
            format!("{} is out of range: 1 to 20 pushes per fire", sync.push_attempts),
        ));
    }
}

/// `builder_paths` are valid globs that stay apart from the write ACL.
fn builder_path_problems(file: &Path, src: &str, s: &RuntimeSettings, d: &mut Vec<Diagnostic>) {
    for g in &s.builder_paths {
        if let Err(e) = globset::Glob::new(g) {
            d.push(Diagnostic::new(
                file,
                yamlpos::line_of_item(src, &["builder_paths"], g),
                "builder_paths",
                format!("invalid glob `{g}`: {e}"),
            ));
        }
    }
    for (glob, reach) in crate::layout::builder_paths_in_reach(&s.builder_paths, &s.permissions.write) {
        d.push(
            Diagnostic::new(
                file,
                yamlpos::line_of_item(src, &["builder_paths"], &glob),
                "builder_paths",
                format!("`{glob}` overlaps the write ACL (`{reach}`): tools could write or replace what the approval names"),
            )
            .with_hint("keep builder_paths apart from permissions.write (the sandbox grants a write glob's whole literal directory)"),
        );
    }
}

/// The runtime's signing key lives outside the repository, at an absolute path.
fn identity_problems(file: &Path, src: &str, identity: &Identity, d: &mut Vec<Diagnostic>) {
    // What git takes for a commit's author: a fire whose identity it refuses would run
    // the model and then fail to commit, every time (helper-79).
    for (field, value) in [("name", &identity.name), ("email", &identity.email)] {
        let why = if value.trim().is_empty() {
            Some("is empty")
        } else if value.contains(['<', '>']) || value.chars().any(char::is_control) {
            Some("holds `<`, `>` or a control character, which a git identity cannot")
        } else {
            None
        };
        if let Some(why) = why {
            d.push(
                Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &["runtime_identity", field]),
                    format!("runtime_identity.{field}"),
                    format!("`{value}` {why}: the runtime's commits are authored with it"),
                )
                .with_hint("for example: runtime_identity: { name: runtime, email: runtime@localhost }"),
            );
        }
    }
    if let Some(key) = &identity.signing_key {
        if !Path::new(key).is_absolute() && !key.starts_with("~/") {
            d.push(
                Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &["runtime_identity", "signing_key"]),
                    "runtime_identity.signing_key",
                    format!("`{key}` must be an absolute path (or start with ~/) to a key on the box"),
                )
                .with_hint(
                    "a key in the repository would be readable by every tool: keep it in the runtime account's home",
                ),
            );
        }
    }
}

/// The telemetry endpoint is a usable OTLP/HTTP base URL.
fn telemetry_problems(file: &Path, src: &str, telemetry: &Telemetry, d: &mut Vec<Diagnostic>) {
    if let Some(url) = &telemetry.endpoint {
        if let Err(why) = check_endpoint(url) {
            d.push(
                Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &["telemetry", "endpoint"]),
                    "telemetry.endpoint",
                    format!("`{url}` {why}"),
                )
                .with_hint("an OTLP/HTTP base URL such as http://127.0.0.1:4318"),
            );
        }
    }
}

/// Rules that do not parse, and write globs that are invalid or reach builder-owned or
/// record directories.
fn permission_problems(file: &Path, src: &str, p: &Permissions, d: &mut Vec<Diagnostic>) {
    for (list, rules) in [("allow", &p.allow), ("ask", &p.ask), ("deny", &p.deny)] {
        for r in rules {
            if let Err(e) = Rule::parse(r) {
                d.push(
                    Diagnostic::new(
                        file,
                        yamlpos::line_of_item(src, &["permissions", list], r),
                        format!("permissions.{list}"),
                        format!("rule `{r}` does not parse: {e}"),
                    )
                    .with_hint("rules look like `Bash(git log*)`, `Read(**)`, `Edit(reports/**)`"),
                );
            }
        }
    }
    for g in &p.write {
        let line = yamlpos::line_of_item(src, &["permissions", "write"], g);
        // The sandbox makes each glob's directory writable: one outside the repository
        // (absolute, `~`, or climbing with `..`) would be a host directory.
        if g.starts_with('/') || g.starts_with('~') || g.split('/').any(|c| c == "..") {
            d.push(
                Diagnostic::new(
                    file,
                    line,
                    "permissions.write",
                    format!("write glob `{g}` leaves the repository"),
                )
                .with_hint("write globs are repo-relative, such as reports/**"),
            );
            continue;
        }
        match globset::Glob::new(g) {
            Err(e) => d.push(Diagnostic::new(
                file,
                line,
                "permissions.write",
                format!("invalid glob `{g}`: {e}"),
            )),
            Ok(glob) => write_glob_overlaps(file, line, g, &glob.compile_matcher(), d),
        }
    }
}

/// The places a write glob `g` (at `file:line`) must not reach: builder-owned
/// directories, the record directories, the runtime's state.
fn write_glob_overlaps(file: &Path, line: usize, g: &str, m: &globset::GlobMatcher, d: &mut Vec<Diagnostic>) {
    if let Some(dir) = overlapping_builder_dir(m, g) {
        d.push(
            Diagnostic::new(
                file,
                line,
                "permissions.write",
                format!("write glob `{g}` overlaps builder-owned `{dir}/`"),
            )
            .with_hint("the runtime may only write reports/, cards/, runs/ and paths outside builder directories"),
        );
    }
    if let Some(dir) = crate::layout::overlapping_record_dir(m, g) {
        d.push(
            Diagnostic::new(
                file,
                line,
                "permissions.write",
                format!("write glob `{g}` reaches `{dir}/`, where only the runtime writes records"),
            )
            .with_hint("receipts and cards are the runtime's alone; point the write ACL at reports/**"),
        );
    }
    if crate::layout::overlaps_state_dir(m, g) {
        d.push(
            Diagnostic::new(
                file,
                line,
                "permissions.write",
                format!(
                    "write glob `{g}` reaches `{}/`, the runtime's own state (its database, its walk memo)",
                    crate::layout::STATE_DIR
                ),
            )
            .with_hint("point the write ACL at reports/**"),
        );
    }
}

/// Budgets must be greater than zero.
fn budget_problems(file: &Path, src: &str, b: &Budgets, d: &mut Vec<Diagnostic>) {
    for (name, bad) in [
        ("max_steps", b.max_steps == 0),
        ("max_wall_s", b.max_wall_s == 0),
        ("max_tokens", b.max_tokens == 0),
        ("max_cost_usd", b.max_cost_usd.is_nan() || b.max_cost_usd <= 0.0),
    ] {
        if bad {
            d.push(Diagnostic::new(
                file,
                yamlpos::line_of(src, &["budgets", name]),
                format!("budgets.{name}"),
                "must be greater than zero",
            ));
        }
    }
}

/// Why `url` cannot be an OTLP/HTTP endpoint, if it cannot.
pub fn check_endpoint(url: &str) -> Result<(), &'static str> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "is not a URL")?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("is not an http(s) URL");
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("names no host");
    }
    Ok(())
}

fn validate_provider(file: &Path, src: &str, key: &str, p: &ProviderSettings, d: &mut Vec<Diagnostic>) {
    match p.kind {
        ProviderKind::Replay => {
            if p.replay.is_none() {
                d.push(Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &[key]),
                    format!("{key}.replay"),
                    "kind `replay` needs `replay:` (path of the recorded trace)",
                ));
            }
        }
        ProviderKind::Openai | ProviderKind::Anthropic => {
            if p.model.is_none() {
                d.push(Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &[key]),
                    format!("{key}.model"),
                    "a model name is required for this provider kind",
                ));
            }
        }
    }
    if let Some(url) = &p.base_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            d.push(Diagnostic::new(
                file,
                yamlpos::line_of(src, &[key, "base_url"]),
                format!("{key}.base_url"),
                format!("`{url}` is not an http(s) URL"),
            ));
        }
    }
    if let Some(env) = &p.api_key_env {
        if !crate::env::is_variable_name(env) {
            d.push(
                Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &[key, "api_key_env"]),
                    format!("{key}.api_key_env"),
                    format!("`{env}` is not an environment variable name"),
                )
                .with_hint("name the variable (OPENAI_API_KEY); never put the key itself in the repo"),
            );
        }
    }
}

/// The `permissions` block of a Claude Code `settings.json`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClaudePermissions {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    additional_directories: Vec<String>,
    #[serde(default)]
    #[allow(dead_code)]
    default_mode: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    disable_bypass_permissions_mode: Option<String>,
}

fn load_claude_json(text: Result<String, String>, rel: &Path, diags: &mut Vec<Diagnostic>) -> Option<Permissions> {
    let src = match text {
        Ok(s) => s,
        Err(e) => {
            diags.push(Diagnostic::new(rel, 0, "", format!("cannot read: {e}")));
            return None;
        }
    };
    let value: serde_json::Value = match serde_json::from_str(&src) {
        Ok(v) => v,
        Err(e) => {
            diags.push(Diagnostic::new(rel, e.line(), "", format!("JSON syntax error: {e}")));
            return None;
        }
    };
    let Some(obj) = value.as_object() else {
        diags.push(Diagnostic::new(rel, 1, "", "expected a JSON object"));
        return None;
    };
    let before = diags.len();
    for k in obj.keys() {
        if k != "permissions" && !CLAUDE_IGNORED_KEYS.contains(&k.as_str()) {
            diags.push(
                Diagnostic::new(rel, json_line(&src, &format!("\"{k}\"")), k.as_str(), "unknown key")
                    .with_hint("only `permissions` is used by the runtime"),
            );
        }
    }
    let perms: ClaudePermissions = match obj.get("permissions") {
        None => ClaudePermissions::default(),
        Some(p) => match serde_path_to_error::deserialize(p) {
            Ok(p) => p,
            Err(e) => {
                let inner = e.inner().to_string();
                let needle = inner
                    .strip_prefix("unknown field `")
                    .and_then(|r| r.split('`').next())
                    .unwrap_or("permissions");
                diags.push(Diagnostic::new(
                    rel,
                    json_line(&src, &format!("\"{needle}\"")),
                    format!("permissions.{}", e.path()),
                    inner,
                ));
                return None;
            }
        },
    };
    for (list, rules) in [("allow", &perms.allow), ("ask", &perms.ask), ("deny", &perms.deny)] {
        for r in rules {
            if let Err(e) = Rule::parse(r) {
                diags.push(Diagnostic::new(
                    rel,
                    json_line(&src, r),
                    format!("permissions.{list}"),
                    format!("rule `{r}` does not parse: {e}"),
                ));
            }
        }
    }
    if diags.len() > before {
        return None;
    }
    Some(Permissions {
        allow: perms.allow,
        ask: perms.ask,
        deny: perms.deny,
        additional_directories: perms.additional_directories,
        ..Permissions::default()
    })
}

fn json_line(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.contains(needle)).map(|i| i + 1).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "version: 1\nprovider:\n  kind: replay\n  replay: evals/digest/trace.json\npermissions:\n  allow: [\"Read(**)\"]\n  write: [\"reports/**\"]\n";

    /// An identity git would refuse for a commit's author is a settings error with its
    /// line, not a fire that runs the model and then cannot commit (helper-79).
    #[test]
    fn a_runtime_identity_git_would_refuse_names_its_line_and_field() {
        for (identity, field) in [
            ("{name: \"\", email: runtime@localhost}", "runtime_identity.name"),
            ("{name: runtime, email: \" \"}", "runtime_identity.email"),
            (
                "{name: \"run <time>\", email: runtime@localhost}",
                "runtime_identity.name",
            ),
        ] {
            let src = format!("{GOOD}\nruntime_identity: {identity}\n");
            let mut d = Vec::new();
            parse_runtime_yaml(&src, &mut d);
            let found = d
                .iter()
                .find(|x| x.field == field)
                .unwrap_or_else(|| panic!("{identity}: {d:?}"));
            assert_eq!(found.line, src.lines().count(), "{found:?}");
        }
    }

    #[test]
    fn review_and_sync_settings_load_and_bad_values_name_their_line() {
        let mut d = Vec::new();
        let s = parse_runtime_yaml(GOOD, &mut d).expect("valid");
        assert!(!s.require_reviewed, "review is off unless asked for");
        let on = format!("{GOOD}\nrequire_reviewed: true\nreview:\n  require_signed: false\n  allowed_signers: settings/allowed_signers\n");
        let s = parse_runtime_yaml(&on, &mut d).expect("valid");
        assert!(d.is_empty(), "{d:?}");
        assert!(s.require_reviewed);
        assert_eq!(s.review.allowed_signers.as_deref(), Some("settings/allowed_signers"));
        // An absolute path is the operator's own file, outside the repository.
        let operator =
            format!("{GOOD}\nreview:\n  require_signed: true\n  allowed_signers: /etc/builder/allowed_signers\n");
        let mut d = Vec::new();
        let s = parse_runtime_yaml(&operator, &mut d).unwrap();
        assert_eq!(
            s.review.allowed_signers.as_deref(),
            Some("/etc/builder/allowed_signers")
        );
        assert!(d.is_empty(), "{d:?}");
        let signed = format!("{GOOD}\nreview:\n  require_signed: true\n");
        let s = parse_runtime_yaml(&signed, &mut d).expect("valid");
        assert!(s.review.require_signed && d.is_empty(), "{d:?}");
        let sync = format!("{GOOD}\nsync:\n  remote: origin\n  branch: main\n");
        let s = parse_runtime_yaml(&sync, &mut d).expect("valid");
        assert_eq!(
            s.sync
                .as_ref()
                .map(|s| (s.remote.as_str(), s.branch.as_str(), s.push_attempts)),
            Some(("origin", "main", 5))
        );
        for (body, field, line) in [
            ("review:\n  allowed_signers: ../keys\n", "review.allowed_signers", 10),
            ("sync:\n  remote: origin\n  branch: \"a..b\"\n", "sync.branch", 11),
            ("sync:\n  remote: origin\n  branch: proposals/x\n", "sync.branch", 11),
            (
                "sync:\n  remote: origin\n  branch: main\n  push_attempts: 0\n",
                "sync.push_attempts",
                12,
            ),
            ("sync:\n  remote: origin\n  branch: main\n  force: true\n", "sync", 0),
            ("sandbox:\n  write_bytes: 4096\n", "sandbox.write_bytes", 10),
        ] {
            let mut d = Vec::new();
            assert!(
                parse_runtime_yaml(&format!("{GOOD}\n{body}"), &mut d).is_none(),
                "{body}"
            );
            assert!(
                d.iter()
                    .any(|x| x.field.starts_with(field) && (line == 0 || x.line == line)),
                "{body}: {d:?}"
            );
        }
    }

    #[test]
    fn loads_good_settings_with_defaults() {
        let mut d = Vec::new();
        let s = parse_runtime_yaml(GOOD, &mut d).expect("valid");
        assert!(d.is_empty());
        assert_eq!(s.budgets.max_steps, 20);
        assert_eq!(s.sandbox.landlock, LandlockMode::Required);
        assert_eq!(s.tools.len(), Tool::ALL.len());
    }

    #[test]
    fn reports_every_section_error_with_lines() {
        let src = "version: 1\nprovider:\n  kind: openai\n  model: m\n  colour: red\nbudgets:\n  max_steps: lots\nsurprise: 1\ntools: [read_file, teleport]\n";
        let mut d = Vec::new();
        assert!(parse_runtime_yaml(src, &mut d).is_none());
        let got: Vec<(usize, &str)> = d.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert!(got.contains(&(5, "provider.colour")), "{d:?}");
        assert!(got.contains(&(7, "budgets.max_steps")), "{d:?}");
        assert!(got.contains(&(8, "surprise")), "{d:?}");
        assert!(got.contains(&(9, "tools")), "semantic checks still run: {d:?}");
    }

    #[test]
    fn a_write_glob_outside_the_repository_is_refused() {
        for g in ["/root/**", "~/.ssh/**", "../outside/**", "reports/../../x/**"] {
            let src =
                format!("version: 1\nprovider: {{kind: replay, replay: x}}\npermissions:\n  write:\n    - \"{g}\"\n");
            let mut d = Vec::new();
            assert!(parse_runtime_yaml(&src, &mut d).is_none(), "{g}");
            assert_eq!(d.len(), 1, "{g}: {d:?}");
            assert_eq!((d[0].line, d[0].field.as_str()), (5, "permissions.write"), "{g}");
            assert!(d[0].message.contains("leaves the repository"), "{d:?}");
        }
    }

    #[test]
    fn a_write_glob_reaching_the_runtimes_state_is_refused() {
        for g in [".runtime/**", "./.runtime/state.db", ".runtime/*"] {
            let src =
                format!("version: 1\nprovider: {{kind: replay, replay: x}}\npermissions:\n  write:\n    - \"{g}\"\n");
            let mut d = Vec::new();
            assert!(parse_runtime_yaml(&src, &mut d).is_none(), "{g}");
            assert_eq!((d[0].line, d[0].field.as_str()), (5, "permissions.write"), "{g}");
            assert!(
                d.iter().any(|x| x.message.contains("the runtime's own state")),
                "{g}: {d:?}"
            );
        }
    }

    #[test]
    fn semantic_errors_point_at_items() {
        let src = "version: 1\nprovider:\n  kind: openai\n  model: m\npermissions:\n  deny:\n    - \"Bash(rm -rf\"\n  write:\n    - \"reports/**\"\n    - \"prompts/**\"\ntools:\n  - read_file\n  - teleport\n";
        let mut d = Vec::new();
        assert!(parse_runtime_yaml(src, &mut d).is_none());
        let got: Vec<(usize, &str)> = d.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert_eq!(
            got,
            vec![(7, "permissions.deny"), (10, "permissions.write"), (13, "tools")],
            "{d:?}"
        );
    }

    #[test]
    fn telemetry_section_is_optional_checked_and_pointed_at() {
        let mut d = Vec::new();
        let s = parse_runtime_yaml(GOOD, &mut d).expect("valid");
        assert_eq!(s.telemetry, Telemetry::default());
        let on = format!("{GOOD}telemetry:\n  endpoint: http://127.0.0.1:4318\n  include_content: true\n");
        let s = parse_runtime_yaml(&on, &mut d).expect("valid");
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(s.telemetry.endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert!(s.telemetry.include_content);
        let bad = format!("{GOOD}telemetry:\n  endpoint: udp://collector:4317\n  include_contents: true\n");
        assert!(parse_runtime_yaml(&bad, &mut d).is_none());
        let got: Vec<(usize, &str)> = d.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert_eq!(got, vec![(10, "telemetry.include_contents")], "{d:?}");
        d.clear();
        let bad = format!("{GOOD}telemetry:\n  endpoint: udp://collector:4317\n");
        assert!(parse_runtime_yaml(&bad, &mut d).is_none());
        let got: Vec<(usize, &str)> = d.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert_eq!(got, vec![(9, "telemetry.endpoint")], "{d:?}");
        assert!(d[0].message.contains("not an http(s) URL"), "{d:?}");
    }
}

/// `docs/settings.md` against the settings types: every key documented, nothing
/// documented that does not exist, the defaults and types the code has, examples that
/// load. A key added to a settings struct fails here until the reference names it.
#[cfg(test)]
mod reference {
    use super::*;
    use serde_yaml::Value;

    const DOC: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"));
    /// The smallest file that loads; examples are merged into it.
    const MINIMAL: &str = "version: 1\nprovider: {kind: replay, replay: evals/digest/replay.json}\n";
    /// Stands for a model name under `prices`.
    const MODEL: &str = "<model>";
    /// Stands for a server name under `mcp`.
    const SERVER: &str = "<server>";

    struct Row {
        key: String,
        ty: String,
        default: String,
        example: String,
    }

    fn rows() -> Vec<Row> {
        let mut out = Vec::new();
        for line in DOC.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 5, "a row has key, type, default, example, meaning: {line}");
            out.push(Row {
                key: cells[0].trim_matches('`').to_string(),
                ty: cells[1].to_string(),
                default: cells[2].to_string(),
                example: cells[3].to_string(),
            });
        }
        out
    }

    /// Every key path of `v` (`limits.max_retries`), sections included.
    fn key_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Value::Mapping(m) = v {
            for (k, child) in m {
                let path = format!("{prefix}{}", k.as_str().expect("string keys"));
                out.push(path.clone());
                key_paths(child, &format!("{path}."), out);
            }
        }
    }

    /// The value at `path` in `v`; `<model>` matches the first key of its mapping.
    fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
        let mut cur = v;
        for seg in path.split('.') {
            let m = cur.as_mapping()?;
            cur = if seg == MODEL || seg == SERVER {
                m.values().next()?
            } else {
                m.get(seg)?
            };
        }
        Some(cur)
    }

    /// Settings as deserialised (no semantic checks) from `yaml`, back as YAML.
    fn typed(yaml: &str) -> Value {
        let s: RuntimeSettings = serde_yaml::from_str(yaml).unwrap();
        serde_yaml::to_value(&s).unwrap()
    }

    /// Every field of the settings types, optional sections filled in.
    fn full() -> Value {
        typed(&format!(
            "version: 1\nprovider: {{kind: replay}}\nfallback: {{kind: replay}}\nsync: {{remote: o, branch: m}}\nruntime_identity: {{name: runtime, email: runtime@localhost, signing_key: /etc/runtime/key}}\nprices: {{\"{MODEL}\": {{input_per_mtok: 1.0, output_per_mtok: 2.0}}}}\nmcp: {{\"{SERVER}\": {{command: [x]}}}}\n"
        ))
    }

    fn merge(base: &mut Value, over: &Value) {
        match (base, over) {
            (Value::Mapping(b), Value::Mapping(o)) => {
                for (k, v) in o {
                    match b.get_mut(k) {
                        Some(slot) => merge(slot, v),
                        None => {
                            b.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (b, o) => *b = o.clone(),
        }
    }

    /// `small` (a mapping: each of its keys) is found in `big`.
    fn contains(big: &Value, small: &Value) -> bool {
        match (big, small) {
            (Value::Mapping(b), Value::Mapping(s)) => s.iter().all(|(k, v)| b.get(k).is_some_and(|bv| contains(bv, v))),
            (b, s) => b == s,
        }
    }

    fn remove(v: &mut Value, path: &str) {
        let (parent, last) = match path.rsplit_once('.') {
            Some((p, l)) => (p, l),
            None => ("", path),
        };
        let mut cur = v;
        if !parent.is_empty() {
            for seg in parent.split('.') {
                let m = cur.as_mapping_mut().unwrap();
                let key = if seg == MODEL || seg == SERVER {
                    m.keys().next().unwrap().clone()
                } else {
                    Value::from(seg)
                };
                cur = m.get_mut(&key).unwrap();
            }
        }
        cur.as_mapping_mut().unwrap().remove(last);
    }

    fn load(v: &Value) -> Result<Value, Vec<Diagnostic>> {
        let mut d = Vec::new();
        match parse_runtime_yaml(&serde_yaml::to_string(v).unwrap(), &mut d) {
            Some(s) if d.is_empty() => Ok(serde_yaml::to_value(&s).unwrap()),
            _ => Err(d),
        }
    }

    fn example(row: &Row) -> Value {
        let text = row
            .example
            .strip_prefix('`')
            .and_then(|e| e.strip_suffix('`'))
            .unwrap_or_else(|| panic!("{}: the example is one YAML fragment in backticks", row.key));
        serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{}: example `{text}`: {e}", row.key))
    }

    #[test]
    fn every_settings_key_is_documented_and_every_documented_key_exists() {
        let mut keys = Vec::new();
        key_paths(&full(), "", &mut keys);
        let top: Vec<&str> = keys.iter().filter(|k| !k.contains('.')).map(String::as_str).collect();
        assert_eq!(top, TOP_KEYS, "TOP_KEYS lists the fields of RuntimeSettings, in order");
        assert!(keys.iter().any(|k| k == "limits.max_output_tokens"));
        let documented: Vec<String> = rows().into_iter().map(|r| r.key).collect();
        let missing: Vec<&String> = keys.iter().filter(|k| !documented.contains(k)).collect();
        let unknown: Vec<&String> = documented.iter().filter(|k| !keys.contains(k)).collect();
        assert!(missing.is_empty(), "keys missing from docs/settings.md: {missing:?}");
        assert!(
            unknown.is_empty(),
            "docs/settings.md documents keys that do not exist: {unknown:?}"
        );
        let mut seen = documented.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), documented.len(), "a key is documented twice");
    }

    #[test]
    fn documented_defaults_and_types_are_the_codes() {
        let defaults = typed("version: 1\nprovider: {kind: replay}\n");
        // An optional section's own defaults, with only its required keys given.
        let sections = typed(&format!(
            "version: 1\nprovider: {{kind: replay}}\nsync: {{remote: o, branch: m}}\nmcp: {{\"{SERVER}\": {{command: [x]}}}}\n"
        ));
        let full = full();
        for row in rows() {
            let key = &row.key;
            let value = if key.contains('.') {
                at(&sections, key)
            } else {
                at(&defaults, key)
            };
            match row.default.as_str() {
                "required" => {}
                "unset" => assert!(
                    value.is_none_or(Value::is_null),
                    "{key}: documented unset, is {value:?}"
                ),
                "from its keys" => assert!(
                    value.is_some_and(Value::is_mapping),
                    "{key}: documented as a section with defaults, is {value:?}"
                ),
                d => {
                    let text = d
                        .strip_prefix('`')
                        .and_then(|d| d.strip_suffix('`'))
                        .unwrap_or_else(|| {
                            panic!("{key}: default `{d}` is not required, unset, from its keys or `value`")
                        });
                    let want: Value = serde_yaml::from_str(text).unwrap();
                    assert_eq!(value, Some(&want), "{key}: documented default `{text}`");
                }
            }
            let Some(v) = at(&full, key).filter(|v| !v.is_null()) else {
                continue;
            };
            let ty = row.ty.as_str();
            let ok = if ty.starts_with("one of") {
                v.as_str().is_some_and(|s| ty.contains(&format!("`{s}`")))
            } else if ty.starts_with("integer") {
                v.is_u64() || v.is_i64()
            } else if ty.starts_with("number") {
                v.is_f64()
            } else if ty.starts_with("string") {
                v.is_string()
            } else if ty.starts_with("list") {
                v.is_sequence()
            } else if ty.starts_with("mapping") {
                v.is_mapping()
            } else if ty.starts_with("boolean") {
                v.is_bool()
            } else {
                panic!("{key}: unknown type `{ty}`")
            };
            assert!(ok, "{key}: documented as {ty}, the code has {v:?}");
        }
    }

    #[test]
    fn every_documented_example_loads_and_sets_its_key() {
        let minimal: Value = serde_yaml::from_str(MINIMAL).unwrap();
        assert!(load(&minimal).is_ok(), "the minimal file loads");
        for row in rows() {
            let key = &row.key;
            let ex = example(&row);
            let want = at(&ex, key).unwrap_or_else(|| panic!("{key}: the example does not set it"));
            let mut merged = minimal.clone();
            merge(&mut merged, &ex);
            let loaded =
                load(&merged).unwrap_or_else(|d| panic!("{key}: example {} does not load: {d:?}", row.example));
            let got = at(&loaded, key).unwrap_or_else(|| panic!("{key}: not in the loaded settings"));
            assert!(contains(got, want), "{key}: example sets {want:?}, loaded {got:?}");
            if row.default == "required" {
                let mut without = merged.clone();
                remove(&mut without, key);
                assert!(load(&without).is_err(), "{key}: documented required, loads without it");
            }
        }
    }

    #[test]
    fn the_reference_is_what_the_test_reads() {
        // Guards the parsing above: a table format change must not empty the check.
        let rows = rows();
        assert!(rows.len() > 40, "{} rows", rows.len());
    }
}
