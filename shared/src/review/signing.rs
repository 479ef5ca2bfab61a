//! Signed approvals (docs/design.md): with `review.require_signed`, an approval
//! counts only when it carries an SSHSIG signature (what `ssh-keygen -Y sign` and git's
//! SSH signing make), in the namespace `builder-approval`, over the approval's
//! canonical [`payload`], by a key that `review.allowed_signers` (git's allowed-signers
//! format) lists for the approver's email. A name and address set through
//! `GIT_AUTHOR_*` prove nothing without the key. Parsing and verification are the
//! `ssh-key` crate's (Ed25519, ECDSA P-256 and RSA keys of at least 2048 bits, RSA
//! signed by SHA-2); signing runs git's signing program
//! (`gpg.ssh.program`, default `ssh-keygen`), so keys in an agent or behind a
//! passphrase work as they do for `git commit -S`.
//!
//! [`ApprovalRule`] is the one rule every judge applies (the runtime's two-key check,
//! the sync's check of an incoming tip, `builder proposals`, `merge` and `audit`): built
//! once from the settings in hand. Which allowed-signers list judges an approval is
//! [`super::trust`]'s call: the list of the tree trusted before the approved one (never
//! the list the approved tree brings), or an operator's file outside the repository
//! when `review.allowed_signers` is an absolute path ([`SignerList::Operator`]).

use super::approvals::ApprovalBody;
use super::same_person;
use crate::diag::Diagnostic;
use crate::settings::RuntimeSettings;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use ssh_key::{PublicKey, SshSig};
use std::path::{Path, PathBuf};

/// The SSHSIG namespace of approvals.
pub const NAMESPACE: &str = "builder-approval";
/// `review.allowed_signers` when the settings name none.
pub const DEFAULT_ALLOWED_SIGNERS: &str = "settings/allowed_signers";
/// An allowed-signers file larger than this is refused (it is a short list of keys).
const MAX_SIGNERS_BYTES: u64 = 1 << 20;

/// The bytes an approval's signature covers: every field of the body but the
/// signature, one per line, in a fixed order (so re-serialising the YAML never
/// changes what was signed).
pub fn payload(body: &ApprovalBody) -> Vec<u8> {
    format!(
        "builder-approval v1\nproposal: {}\ntree: {}\napprover: {}\napproved_at: {}\nhead: {}\n",
        body.proposal,
        body.tree,
        body.approver,
        body.approved_at.to_rfc3339(),
        body.head.as_deref().unwrap_or("")
    )
    .into_bytes()
}

/// One line of an allowed-signers file.
#[derive(Debug, Clone)]
struct Signer {
    line: usize,
    /// Email patterns (`*` and `?` wildcards), compared case-insensitively.
    principals: Vec<globset::GlobMatcher>,
    /// `namespaces="a,b"`: the key signs only in these.
    namespaces: Option<Vec<String>>,
    valid_after: Option<DateTime<Utc>>,
    valid_before: Option<DateTime<Utc>>,
    key: PublicKey,
}

/// A parsed allowed-signers file (git's `gpg.ssh.allowedSignersFile` format):
/// `principals [options] keytype base64-key [comment]`, `#` comments and blank lines
/// skipped. Options understood: `namespaces="..."`, `valid-after="..."`,
/// `valid-before="..."` (`YYYYMMDD[HHMM[SS]]`, read as UTC); `cert-authority` and
/// anything else is refused with the file and line.
#[derive(Debug, Clone)]
pub struct AllowedSigners {
    path: PathBuf,
    signers: Vec<Signer>,
}

/// Where the allowed-signers list of signed approvals comes from.
#[derive(Debug, Clone)]
pub enum SignerList {
    /// `review.allowed_signers` is repo-relative: the list in the tree trusted before
    /// the judged one ([`super::trust`]).
    Repository(String),
    /// `review.allowed_signers` is an absolute path (an operator's file outside the
    /// repository): the only list, read once as is, whatever any tree says.
    Operator(AllowedSigners),
}

/// Splits a line into whitespace-separated tokens; double quotes group (and are kept).
fn tokens(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match (c, start) {
            ('"', _) => {
                quoted = !quoted;
                start.get_or_insert(i);
            }
            (c, Some(s)) if c.is_whitespace() && !quoted => {
                out.push(&line[s..i]);
                start = None;
            }
            (c, None) if !c.is_whitespace() => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(&line[s..]);
    }
    out
}

/// Splits on commas outside double quotes.
fn split_commas(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s)
}

/// An allowed-signers file that cannot be read, with the hint every such error gives.
fn unreadable(path: &Path, msg: String) -> Diagnostic {
    Diagnostic::new(path, 0, "review.allowed_signers", msg).with_hint(
        "list each approver's public key: `<email> namespaces=\"builder-approval\" <the contents of their .pub file>`",
    )
}

fn is_key_type(t: &str) -> bool {
    t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-")
}

/// `YYYYMMDD`, `YYYYMMDDHHMM` or `YYYYMMDDHHMMSS`, optionally ending in `Z`; UTC.
fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    let s = s.strip_suffix('Z').unwrap_or(s);
    let t = match s.len() {
        8 => NaiveDate::parse_from_str(s, "%Y%m%d").ok()?.and_hms_opt(0, 0, 0)?,
        12 => NaiveDateTime::parse_from_str(s, "%Y%m%d%H%M").ok()?,
        14 => NaiveDateTime::parse_from_str(s, "%Y%m%d%H%M%S").ok()?,
        _ => return None,
    };
    Some(t.and_utc())
}

impl AllowedSigners {
    /// Parses `text`, the contents of `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<AllowedSigners, Diagnostic> {
        let mut signers = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let bad = |msg: String| Diagnostic::new(path, line, "allowed_signers", msg);
            let toks = tokens(trimmed);
            let Some((principals, rest)) = toks.split_first() else {
                continue;
            };
            let (options, rest) = match rest.first() {
                Some(t) if !is_key_type(t) => (Some(*t), &rest[1..]),
                _ => (None, rest),
            };
            let [kind, data, ..] = rest else {
                return Err(bad(
                    "expected `principals [options] keytype base64-key`: no key on this line".into(),
                ));
            };
            let key = PublicKey::from_openssh(&format!("{kind} {data}"))
                .map_err(|e| bad(format!("cannot read the `{kind}` key: {e}")))?;
            let mut patterns = Vec::new();
            for p in split_commas(unquote(principals)) {
                let glob = globset::GlobBuilder::new(p.trim())
                    .case_insensitive(true)
                    .literal_separator(false)
                    .build()
                    .map_err(|e| bad(format!("principal `{p}`: {e}")))?;
                patterns.push(glob.compile_matcher());
            }
            let mut signer = Signer {
                line,
                principals: patterns,
                namespaces: None,
                valid_after: None,
                valid_before: None,
                key,
            };
            for opt in options.map(split_commas).unwrap_or_default() {
                let (name, value) = match opt.split_once('=') {
                    Some((n, v)) => (n.trim().to_ascii_lowercase(), Some(unquote(v.trim()))),
                    None => (opt.trim().to_ascii_lowercase(), None),
                };
                let time = |v: Option<&str>| {
                    v.and_then(parse_time)
                        .ok_or_else(|| bad(format!("option `{opt}`: expected a time YYYYMMDD[HHMM[SS]]")))
                };
                match (name.as_str(), value) {
                    ("namespaces", Some(v)) => {
                        signer.namespaces = Some(v.split(',').map(|n| n.trim().to_string()).collect())
                    }
                    ("valid-after", v) => signer.valid_after = Some(time(v)?),
                    ("valid-before", v) => signer.valid_before = Some(time(v)?),
                    ("cert-authority", _) => {
                        return Err(bad(
                            "`cert-authority` (certificate signers) is not supported: list the signing keys themselves"
                                .into(),
                        ))
                    }
                    _ => {
                        return Err(bad(format!(
                            "unknown option `{opt}` (known: namespaces, valid-after, valid-before)"
                        )))
                    }
                }
            }
            signers.push(signer);
        }
        Ok(AllowedSigners {
            path: path.to_path_buf(),
            signers,
        })
    }

    /// Reads the operator's list at the absolute `path` (outside the repository, read
    /// as is: links followed, as for any file an operator names).
    pub fn load_absolute(path: &Path) -> Result<AllowedSigners, Diagnostic> {
        use std::io::Read;
        let unreadable = |msg: String| unreadable(path, msg);
        let file =
            std::fs::File::open(path).map_err(|e| unreadable(format!("cannot open the allowed-signers file: {e}")))?;
        let mut bytes = Vec::new();
        file.take(MAX_SIGNERS_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| unreadable(format!("cannot read the allowed-signers file: {e}")))?;
        if bytes.len() as u64 > MAX_SIGNERS_BYTES {
            return Err(unreadable(format!("larger than {MAX_SIGNERS_BYTES} bytes")));
        }
        let text = String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8".into()))?;
        AllowedSigners::parse(path, &text)
    }

    /// Reads `rel` from the git tree `tree` (of `commit`, named in errors): a regular
    /// file there, never a link.
    pub fn from_tree(
        repo: &git2::Repository,
        commit: git2::Oid,
        tree: &git2::Tree,
        rel: &str,
    ) -> Result<AllowedSigners, Diagnostic> {
        let shown = Path::new(rel);
        let short = crate::text::short_oid(commit);
        let unreadable = |msg: String| unreadable(shown, format!("{msg} (in commit {short})"));
        let entry = tree
            .get_path(shown)
            .map_err(|_| unreadable("there is no allowed-signers file at this path".into()))?;
        if entry.filemode() != i32::from(git2::FileMode::Blob)
            && entry.filemode() != i32::from(git2::FileMode::BlobExecutable)
        {
            return Err(unreadable("not a regular file (a link or a directory)".into()));
        }
        let blob = repo
            .find_blob(entry.id())
            .map_err(|e| unreadable(format!("cannot read its blob: {}", e.message())))?;
        if blob.size() as u64 > MAX_SIGNERS_BYTES {
            return Err(unreadable(format!("larger than {MAX_SIGNERS_BYTES} bytes")));
        }
        let text = std::str::from_utf8(blob.content()).map_err(|_| unreadable("not UTF-8".into()))?;
        AllowedSigners::parse(shown, text)
    }

    /// The file the list was read from (repo-relative, or the operator's absolute path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `body`'s signature counts: `Ok` with the signer's line and key
    /// fingerprint, or why not.
    pub fn verify(&self, body: &ApprovalBody) -> Result<String, String> {
        let Some(armored) = body.signature.as_deref() else {
            return Err("it is not signed".into());
        };
        let email = super::parse_person(&body.approver)
            .map(|p| p.email)
            .ok_or_else(|| format!("its approver `{}` is not \"Name <email>\"", body.approver))?;
        self.verify_in(NAMESPACE, &email, body.approved_at, &payload(body), armored)
    }

    /// Whether the armored SSHSIG `armored` over `message` counts as `email`'s in
    /// `namespace` at the time `at`: a key this list names for that email (its
    /// `namespaces=` allowing `namespace`, valid at `at`) made it. `Ok` with the
    /// signer's line and key fingerprint, or why not. Approvals and runtime commits are
    /// both judged here, each in its own namespace.
    pub fn verify_in(
        &self,
        namespace: &str,
        email: &str,
        at: DateTime<Utc>,
        message: &[u8],
        armored: &str,
    ) -> Result<String, String> {
        let sig = SshSig::from_pem(armored).map_err(|e| format!("its signature is unreadable: {e}"))?;
        if sig.namespace() != namespace {
            return Err(format!(
                "it is signed in namespace `{}`, not `{namespace}`",
                sig.namespace()
            ));
        }
        let fingerprint = sig.public_key().fingerprint(Default::default());
        let mut why = format!("key {fingerprint} is not in {} for {email}", self.path.display());
        for s in self.signers.iter().filter(|s| s.key.key_data() == sig.public_key()) {
            if !s.principals.iter().any(|p| p.is_match(email)) {
                continue;
            }
            let line = format!("{}:{}", self.path.display(), s.line);
            if let Some(ns) = &s.namespaces {
                if !ns.iter().any(|n| n == namespace) {
                    why = format!("{line} limits key {fingerprint} to namespaces {}", ns.join(","));
                    continue;
                }
            }
            if s.valid_after.is_some_and(|t| at < t) || s.valid_before.is_some_and(|t| at >= t) {
                why = format!("{line}: key {fingerprint} was not valid at {at}");
                continue;
            }
            if let Some(weak) = weak_rsa(&s.key, &sig) {
                return Err(format!("{line}: key {fingerprint}: {weak}"));
            }
            return match s.key.verify(namespace, message, &sig) {
                Ok(()) => Ok(format!("{line} ({fingerprint})")),
                Err(e) => Err(format!("its signature by {fingerprint} does not verify: {e}")),
            };
        }
        Err(why)
    }
}

/// Why an RSA key or its signature does not count, as OpenSSH judges them: a key
/// under 2048 bits (its modulus, public in the allowed-signers file, can be
/// factored), or a signature by SHA-1 (`ssh-rsa`, which `ssh-keygen -Y verify`
/// refuses too) (helper-110: a 512-bit key and SHA-1 signatures approved).
fn weak_rsa(key: &PublicKey, sig: &SshSig) -> Option<String> {
    const MIN_RSA_BITS: usize = 2048;
    let rsa = key.key_data().rsa()?;
    let bits = rsa.n.as_positive_bytes().map_or(0, |b| {
        let lead = b.first().map_or(8, |x| x.leading_zeros() as usize);
        b.len() * 8 - lead
    });
    if bits < MIN_RSA_BITS {
        return Some(format!("an RSA key of {bits} bits (at least {MIN_RSA_BITS} count)"));
    }
    match sig.algorithm() {
        ssh_key::Algorithm::Rsa { hash: None } => {
            Some("an RSA signature by SHA-1 (`ssh-rsa`): only rsa-sha2-256 and rsa-sha2-512 count".into())
        }
        _ => None,
    }
}

/// Who may approve and how it is proven, from the settings in hand: the one rule
/// every judge of approvals applies.
#[derive(Debug, Clone)]
pub struct ApprovalRule {
    /// Approvals by this address never count (the runtime's identity).
    pub runtime_email: String,
    /// `Some`: only approvals signed by a key an allowed-signers list names count.
    pub signers: Option<SignerList>,
}

impl ApprovalRule {
    /// A rule that checks identities only (no signatures).
    pub fn unsigned(runtime_email: &str) -> ApprovalRule {
        ApprovalRule {
            runtime_email: runtime_email.to_string(),
            signers: None,
        }
    }

    /// The rule of `settings`: with `review.require_signed`, the list is
    /// `review.allowed_signers`, read from the trusted tree when repo-relative, or
    /// here, once, when it is an absolute path (the operator's file).
    pub fn from_settings(settings: &RuntimeSettings) -> Result<ApprovalRule, Diagnostic> {
        let signers = if settings.review.require_signed {
            let path = settings
                .review
                .allowed_signers
                .as_deref()
                .unwrap_or(DEFAULT_ALLOWED_SIGNERS);
            Some(if Path::new(path).is_absolute() {
                SignerList::Operator(AllowedSigners::load_absolute(Path::new(path))?)
            } else {
                SignerList::Repository(path.to_string())
            })
        } else {
            None
        };
        Ok(ApprovalRule {
            runtime_email: settings.runtime_identity.email.clone(),
            signers,
        })
    }

    /// Whether an approval with `body` counts when judged by `list` (the list of the
    /// tree trusted before the approved one; unused without signatures), or why not.
    pub fn judge(&self, body: &ApprovalBody, list: Option<&AllowedSigners>) -> Result<(), String> {
        let email = super::parse_person(&body.approver)
            .map(|p| p.email)
            .ok_or_else(|| format!("its approver `{}` is not \"Name <email>\"", body.approver))?;
        if same_person(&email, &self.runtime_email) {
            return Err(format!("{email} is the runtime identity"));
        }
        match (&self.signers, list) {
            (None, _) => Ok(()),
            (Some(_), Some(list)) => list.verify(body).map(|_| ()),
            (Some(_), None) => Err("no allowed-signers list could be read to judge its signature".into()),
        }
    }
}

/// Why signing failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("cannot run `{program}` to sign the approval: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("`{program} -Y sign -f {key}` failed: {stderr}")]
    Failed {
        program: String,
        key: String,
        stderr: String,
    },
}

/// The key and program git's configuration names for SSH signing: `user.signingkey`
/// when `gpg.format` is `ssh` (a path; `~/` is the home directory), and
/// `gpg.ssh.program` (default `ssh-keygen`).
pub fn git_signing_key(repo: &git2::Repository) -> (Option<PathBuf>, String) {
    let Ok(cfg) = repo.config() else {
        return (None, "ssh-keygen".into());
    };
    let program = cfg
        .get_string("gpg.ssh.program")
        .unwrap_or_else(|_| "ssh-keygen".into());
    let ssh = cfg.get_string("gpg.format").is_ok_and(|f| f == "ssh");
    let key = cfg.get_string("user.signingkey").ok().filter(|_| ssh).map(|k| {
        match (k.strip_prefix("~/"), std::env::var_os("HOME")) {
            (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
            _ => PathBuf::from(k),
        }
    });
    (key, program)
}

/// Signs `body`'s [`payload`] with `key` through `program` (`-Y sign -n
/// builder-approval`, the payload on stdin); returns the armored signature.
pub fn sign(body: &ApprovalBody, key: &Path, program: &str) -> Result<String, SignError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let spawn = |source| SignError::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = Command::new(program)
        .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&payload(body)).map_err(spawn)?;
    }
    let out = child.wait_with_output().map_err(spawn)?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() || !text.contains("BEGIN SSH SIGNATURE") {
        return Err(SignError::Failed {
            program: program.to_string(),
            key: key.display().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(text)
}

/// Test keys, shared by the tests of signing, trust and sync.
#[cfg(test)]
pub(crate) mod test_keys {
    use std::path::{Path, PathBuf};

    /// An Ed25519 key pair made by `ssh-keygen`: (private key, public key line);
    /// `None` when `ssh-keygen` is not installed, the test then skipping
    /// ([`crate::test_skip::skip`]: a failure where the run declares `ssh-keygen`).
    pub(crate) fn keygen(dir: &Path, name: &str) -> Option<(PathBuf, String)> {
        keygen_of(dir, name, "ed25519")
    }

    /// [`keygen`] of a key of `kind` (`ssh-keygen -t`).
    pub(crate) fn keygen_of(dir: &Path, name: &str, kind: &str) -> Option<(PathBuf, String)> {
        let key = dir.join(name);
        let status = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
            .arg(&key)
            .status();
        match status {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::test_skip::skip(crate::test_skip::Capability::SshKeygen, "ssh-keygen is not installed");
                None
            }
            Err(e) => panic!("ssh-keygen: {e}"),
            Ok(s) => {
                assert!(s.success(), "ssh-keygen failed: {s}");
                Some((key.clone(), std::fs::read_to_string(key.with_extension("pub")).unwrap()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::signing::test_keys::keygen;

    fn body(approver: &str) -> ApprovalBody {
        ApprovalBody {
            proposal: "p".into(),
            tree: "a".repeat(40),
            approver: approver.into(),
            approved_at: "2026-01-02T03:04:05Z".parse().unwrap(),
            head: Some("b".repeat(40)),
            signature: None,
        }
    }

    #[test]
    fn a_signature_counts_only_from_a_listed_key_for_the_approvers_email() {
        let dir = tempfile::tempdir().unwrap();
        let Some((ann_key, ann_pub)) = keygen(dir.path(), "ann") else {
            return;
        };
        let (eve_key, _) = keygen(dir.path(), "eve").unwrap();
        let list =
            format!("# reviewers\n\nann@example.com,*@ops.example.com namespaces=\"git,builder-approval\" {ann_pub}");
        let signers = AllowedSigners::parse(Path::new("settings/allowed_signers"), &list).unwrap();
        let mut b = body("Ann <ANN@example.com>");
        assert_eq!(signers.verify(&b).unwrap_err(), "it is not signed");
        b.signature = Some(sign(&b, &ann_key, "ssh-keygen").unwrap());
        assert!(signers.verify(&b).unwrap().starts_with("settings/allowed_signers:3"));
        // The same signature over another tree does not verify.
        let mut moved = b.clone();
        moved.tree = "c".repeat(40);
        assert!(signers.verify(&moved).unwrap_err().contains("does not verify"));
        // Ann's key, claimed by someone whose address the file does not list for it.
        let mut other = body("Bob <bob@example.com>");
        other.signature = Some(sign(&other, &ann_key, "ssh-keygen").unwrap());
        assert!(signers
            .verify(&other)
            .unwrap_err()
            .contains("not in settings/allowed_signers for bob@example.com"));
        // A wildcard principal.
        let mut ops = body("Ops <x@ops.example.com>");
        ops.signature = Some(sign(&ops, &ann_key, "ssh-keygen").unwrap());
        assert!(signers.verify(&ops).is_ok());
        // Eve's key is listed nowhere.
        let mut eve = body("Ann <ann@example.com>");
        eve.signature = Some(sign(&eve, &eve_key, "ssh-keygen").unwrap());
        assert!(signers.verify(&eve).unwrap_err().contains("is not in"));
        // The runtime identity never counts, signed or not.
        let rule = ApprovalRule {
            runtime_email: "ann@example.com".into(),
            signers: Some(SignerList::Repository(DEFAULT_ALLOWED_SIGNERS.into())),
        };
        assert!(rule.judge(&b, Some(&signers)).unwrap_err().contains("runtime identity"));
        assert!(rule.judge(&ops, None).unwrap_err().contains("no allowed-signers list"));
    }

    /// A 2048-bit RSA key's approval counts; a 1024-bit key's, listed all the same,
    /// does not (its modulus is public and small enough to factor).
    #[test]
    fn an_rsa_key_counts_from_2048_bits() {
        let dir = tempfile::tempdir().unwrap();
        let Some((strong, strong_pub)) = crate::review::signing::test_keys::keygen_of(dir.path(), "strong", "rsa")
        else {
            return;
        };
        let weak = dir.path().join("weak");
        let made = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "rsa", "-b", "1024", "-N", "", "-C", "weak", "-f"])
            .arg(&weak)
            .status()
            .unwrap();
        assert!(made.success());
        let weak_pub = std::fs::read_to_string(weak.with_extension("pub")).unwrap();
        let list = format!("ann@example.com {strong_pub}\nbob@example.com {weak_pub}");
        let signers = AllowedSigners::parse(Path::new("s"), &list).unwrap();
        let mut ann = body("Ann <ann@example.com>");
        ann.signature = Some(sign(&ann, &strong, "ssh-keygen").unwrap());
        assert!(signers.verify(&ann).is_ok(), "{:?}", signers.verify(&ann));
        let mut bob = body("Bob <bob@example.com>");
        bob.signature = Some(sign(&bob, &weak, "ssh-keygen").unwrap());
        let refused = signers.verify(&bob).unwrap_err();
        assert!(refused.contains("an RSA key of 1024 bits"), "{refused}");
    }

    #[test]
    fn options_limit_a_key_and_bad_lines_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let Some((key, public)) = keygen(dir.path(), "k") else {
            return;
        };
        let path = Path::new("s");
        let mut b = body("K <k@x.org>");
        b.signature = Some(sign(&b, &key, "ssh-keygen").unwrap());
        let git_only = AllowedSigners::parse(path, &format!("k@x.org namespaces=\"git\" {public}")).unwrap();
        assert!(git_only.verify(&b).unwrap_err().contains("namespaces git"));
        let later = AllowedSigners::parse(path, &format!("k@x.org valid-after=\"20270101\" {public}")).unwrap();
        assert!(later.verify(&b).unwrap_err().contains("not valid at"));
        let ok = AllowedSigners::parse(
            path,
            &format!("k@x.org valid-after=\"20250101\",valid-before=\"202701010000\" {public}"),
        )
        .unwrap();
        assert!(ok.verify(&b).is_ok());
        for (text, want) in [
            (format!("\nk@x.org cert-authority {public}"), "cert-authority"),
            ("k@x.org\n".to_string(), "no key"),
            ("k@x.org ssh-ed25519 AAAAnotbase64!".to_string(), "cannot read"),
            (format!("k@x.org restrict {public}"), "unknown option `restrict`"),
            (format!("k@x.org valid-after=\"soon\" {public}"), "YYYYMMDD"),
        ] {
            let e = AllowedSigners::parse(path, &text).unwrap_err();
            let line = text.lines().position(|l| !l.trim().is_empty()).unwrap() + 1;
            assert_eq!(e.line, line, "{text}");
            assert!(e.to_string().contains(want), "{e} lacks {want}");
        }
    }
}
