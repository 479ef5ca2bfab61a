//! The trusted configuration of an eval (DESIGN.md section 8, "Evals are not powers"):
//! where it comes from (the base revision's settings, read from git, or an operator's
//! file named on the command line), the file every eval fire is handed
//! (`runtime fire --eval --trusted-settings FILE`), the environment an eval fire gets
//! (an allow-list: nothing of the reviewer's but the locale, `PATH` and, for a case
//! that calls the live model, the trusted key variables), and each revision's powers
//! judged against it before anything of the revision runs ([`crate::powers`]).

use super::{EvalError, Revision};
use crate::powers::{self, Effect, PowerChange};
use crate::settings::RuntimeSettings;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the trusted configuration comes from.
#[derive(Debug, Clone)]
pub enum TrustedSource {
    /// The base revision's settings (`settings/` of its commit, from git).
    Base,
    /// An operator's settings file (the format of `settings/runtime.yaml`).
    File(PathBuf),
}

/// The trusted configuration, resolved, with the file eval fires read it from.
pub struct Trusted {
    pub settings: RuntimeSettings,
    /// In words: `the base (1a2b3c4d5e6f)` or the operator's file.
    pub from: String,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

/// One revision's powers against the trusted configuration.
#[derive(Debug, Clone, Serialize)]
pub struct RevisionPowers {
    /// `base` or `head`.
    pub revision: &'static str,
    /// Every power the revision sets differently (settings, and prompts' prefetch ports).
    pub changes: Vec<PowerChange>,
    /// Why the revision's eval was refused (it widens a power), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Trusted {
    /// Resolves `source`; `base` is the revision compared against, if any.
    pub fn resolve(
        repo: &git2::Repository,
        source: &TrustedSource,
        base: Option<&Revision>,
    ) -> Result<Trusted, EvalError> {
        let (settings, from) = match (source, base) {
            (TrustedSource::File(path), _) => (
                powers::load_trusted_file(path).map_err(|e| EvalError::Trusted(e.to_string()))?,
                format!("the operator's file {}", path.display()),
            ),
            (TrustedSource::Base, Some(b)) => {
                let id = git2::Oid::from_str(&b.commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
                let s = crate::review::delta::settings_of_commit(repo, id, &b.rev)
                    .map_err(|e| EvalError::Trusted(format!("the base's settings cannot be trusted: {e}")))?;
                (s, format!("the base ({})", short(&b.commit)))
            }
            (TrustedSource::Base, None) => {
                return Err(EvalError::Trusted(
                    "no base revision to take the trusted settings from (the head has no parent)".into(),
                ))
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("builder-trusted-")
            .tempdir()
            .map_err(|source| EvalError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let file = dir.path().join("runtime.yaml");
        let text = powers::to_yaml(&settings).map_err(|e| EvalError::Trusted(e.to_string()))?;
        std::fs::write(&file, text).map_err(|source| EvalError::Io {
            path: file.clone(),
            source,
        })?;
        Ok(Trusted {
            settings,
            from,
            file,
            _dir: dir,
        })
    }

    /// The settings file eval fires are handed.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The powers of `rev` (its settings and the prefetch entries of the prompts of
    /// `tasks`, all read from git) against the trusted configuration.
    pub fn judge(
        &self,
        repo: &git2::Repository,
        revision: &'static str,
        rev: &Revision,
        tasks: &[String],
    ) -> Result<RevisionPowers, EvalError> {
        let id = git2::Oid::from_str(&rev.commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
        let mut changes = match crate::review::delta::settings_of_commit(repo, id, &rev.rev) {
            Ok(s) => powers::changes(&self.settings, &s),
            // Settings that do not load never fire (the fire refuses them itself).
            Err(_) => Vec::new(),
        };
        let tree = repo
            .find_commit(id)
            .and_then(|c| c.tree())
            .map_err(|e| EvalError::Worktree(e.to_string()))?;
        for task in tasks {
            let rel = crate::prompt::prompt_path(task);
            let Some(text) = tree
                .get_path(&rel)
                .ok()
                .and_then(|e| repo.find_blob(e.id()).ok())
                .map(|b| String::from_utf8_lossy(b.content()).into_owned())
            else {
                continue;
            };
            if let Some(front) = crate::prompt::front_matter(&rel, &text) {
                changes.extend(powers::prefetch_widenings(
                    &self.settings,
                    &rel.to_string_lossy(),
                    &front.prefetch,
                ));
            }
        }
        let widened: Vec<PowerChange> = changes.iter().filter(|c| c.effect == Effect::Widens).cloned().collect();
        Ok(RevisionPowers {
            revision,
            refused: (!widened.is_empty())
                .then(|| format!("refused, nothing of it ran: {}", powers::describe_widenings(&widened))),
            changes,
        })
    }

    /// The key variables of the trusted providers, with their values in this
    /// process's environment (those set).
    fn keys(&self) -> Vec<(String, std::ffi::OsString)> {
        [Some(&self.settings.provider), self.settings.fallback.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.api_key_env.clone())
            .filter_map(|k| std::env::var_os(&k).map(|v| (k, v)))
            .collect()
    }

    /// `cmd` (an eval fire) with the allow-listed environment only: the locale and
    /// `PATH`, `home` as `HOME`, and with `live` (a case that calls the trusted model)
    /// the trusted key variables.
    pub fn environment(&self, cmd: &mut Command, home: &Path, live: bool) {
        cmd.env_clear();
        for k in crate::env::PASSTHROUGH_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("HOME", home).env("GIT_CONFIG_NOSYSTEM", "1");
        if live {
            cmd.envs(self.keys());
        }
    }

    /// A redactor for what eval fires leave: the trusted key variables' values.
    pub fn redactor(&self) -> crate::secrets::Redactor {
        crate::fire::config::redactor(Some(&self.settings))
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
