//! The `replay` provider: answers from a recorded trace, turn by turn, for offline
//! demos, evals and tests. The answer for a request is the turn whose index is the
//! number of assistant messages already in the conversation, so a resumed run picks
//! up where it stopped.

use super::{Message, ModelRequest, ModelResponse, ProviderError, ProviderErrorKind, ToolCall};
use crate::records::Tokens;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A recorded trace file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayTrace {
    pub version: u32,
    #[serde(default)]
    pub model: Option<String>,
    pub turns: Vec<ReplayTurn>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayTurn {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ReplayCall>,
    #[serde(default)]
    pub usage: ReplayUsage,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayCall {
    pub id: String,
    pub name: String,
    /// An object, or a string holding raw (possibly invalid) JSON.
    pub arguments: serde_json::Value,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayUsage {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
}

pub struct Replay {
    trace: ReplayTrace,
}

/// The most a replay trace may hold.
pub const TRACE_CAP: u64 = 64 << 20;

/// A trace that cannot be read or understood: a configuration error.
fn config_error(message: String) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Config, None, message)
}

impl Replay {
    /// Loads the trace at `path`. One inside `root` (the repository's own trace, an
    /// eval's case or script) is read through no link at any level and only from a
    /// regular file: an eval fires a proposal's tree on the reviewer's machine, and a
    /// trace linked to a file of theirs would be read as the model's answers.
    pub fn load(root: &Path, path: &Path) -> Result<Replay, ProviderError> {
        let bytes = match path.strip_prefix(root) {
            Ok(inside) => crate::beneath::open_root(root)
                .map_err(|e| e.to_string())
                .and_then(|dir| crate::beneath::read_regular(&dir, inside, TRACE_CAP).map_err(|e| e.to_string())),
            Err(_) => read_outside(path),
        }
        .map_err(|e| config_error(format!("{}: {e}", path.display())))?;
        Replay::parse(bytes, &path.display().to_string())
    }

    /// The trace in `bytes`, read from `name` (a file, or a committed blob).
    pub fn parse(bytes: Vec<u8>, name: &str) -> Result<Replay, ProviderError> {
        let err = config_error;
        if bytes.len() as u64 > TRACE_CAP {
            return Err(err(format!("{name}: over {TRACE_CAP} bytes")));
        }
        let src = String::from_utf8(bytes).map_err(|_| err(format!("{name}: not UTF-8 text")))?;
        let trace: ReplayTrace = serde_json::from_str(&src).map_err(|e| err(format!("{name}:{}: {e}", e.line())))?;
        Ok(Replay { trace })
    }

    /// The recorded turns.
    pub fn into_trace(self) -> ReplayTrace {
        self.trace
    }

    pub fn model(&self) -> &str {
        self.trace.model.as_deref().unwrap_or("replay")
    }

    pub fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let turn_index = req
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        let turn = self.trace.turns.get(turn_index).ok_or_else(|| ProviderError {
            kind: ProviderErrorKind::ReplayExhausted,
            status: None,
            message: format!(
                "the recorded trace has {} turns; turn {} was asked for",
                self.trace.turns.len(),
                turn_index + 1
            ),
            retries: 0,
            timeout_s: None,
        })?;
        let tool_calls = turn
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: match &c.arguments {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            })
            .collect();
        let usage = Tokens {
            input: turn.usage.input,
            output: turn.usage.output,
        };
        Ok(ModelResponse::parsed(turn.content.clone(), tool_calls, usage))
    }
}

/// A trace file outside the repository (`--replay`): a regular file within
/// [`TRACE_CAP`] ([`crate::regular::read`]: a FIFO or a device named there is refused
/// instead of holding the fire, and its task lock, and `/dev/zero` is not read to the
/// end of memory).
fn read_outside(path: &Path) -> Result<Vec<u8>, String> {
    crate::regular::read(path, TRACE_CAP).map_err(|e| match crate::regular::refused(&e) {
        Some(crate::regular::Refused::TooLarge(_)) => format!("over {TRACE_CAP} bytes"),
        _ => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO or a device named with `--replay` is refused at once; a file over the
    /// cap is refused for its size, not read to the end (helper-79).
    #[test]
    fn a_replay_file_outside_the_repository_must_be_a_regular_file_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("t.fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let root = dir.path().join("repo");
        for odd in [fifo.as_path(), Path::new("/dev/zero")] {
            let e = Replay::load(&root, odd).map(|_| ()).unwrap_err();
            assert!(e.message.contains("not a regular file"), "{odd:?}: {e:?}");
        }
        let big = dir.path().join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(TRACE_CAP + 10).unwrap();
        let e = Replay::load(&root, &big).map(|_| ()).unwrap_err();
        assert!(e.message.contains("over"), "{e:?}");
    }
}
