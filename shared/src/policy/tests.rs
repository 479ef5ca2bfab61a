//! Policy engine cases: each bypass class of docs/design.md (flag reordering,
//! chaining, wrappers, nested shells, substitutions, heredocs, interpreters, `sed -i`
//! with several targets, path tricks) against a realistic rule set.

use super::*;
use crate::settings::Permissions;
use Decision::{Allow, Ask, Deny};

fn policy() -> Policy {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let perms = Permissions {
        allow: s(&[
            "Read(**)",
            "Bash(git log*)",
            "Bash(git status)",
            "Bash(git diff:*)",
            "Bash(ls*)",
            "Bash(cat*)",
            "Bash(echo*)",
            "Bash(grep*)",
            "Bash(wc*)",
            "Bash(sed*)",
            "Bash(cp*)",
            "Bash(mv*)",
            "Bash(touch*)",
            "Bash(find*)",
            "Bash(python3*)",
            "Bash(tee*)",
            "Bash(head*)",
            "Bash(sort*)",
            "Bash(date)",
            "Bash(mkdir*)",
            "Bash(rm*)",
            "Bash(bash*)",
            "Bash(sh*)",
            "Bash(xargs*)",
            "Bash(tar*)",
            "Bash(dd*)",
            "Bash(truncate*)",
            "Bash(ln*)",
            "Bash(perl*)",
        ]),
        ask: s(&["Bash(curl*)", "Edit(reports/drafts/**)"]),
        deny: s(&[
            "Bash(rm -rf*)",
            "Bash(git push*)",
            "Read(**/.env)",
            "Bash(sudo*)",
            "Bash(chmod*)",
        ]),
        write: s(&["reports/**", "cards/**"]),
        ..Permissions::default()
    };
    Policy::new(Path::new("/repo"), &perms, &["docs/policy/**".to_string()]).unwrap()
}

fn check(cases: &[(&str, Decision)]) {
    let p = policy();
    let mut failures = Vec::new();
    for (cmd, want) in cases {
        let v = p.decide(Call::RunCommand(cmd));
        if v.decision != *want {
            failures.push(format!("{cmd:?}: want {want:?}, got {:?} ({})", v.decision, v.reason));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn plain_allowed_commands() {
    check(&[
        ("git log --oneline -n 5", Allow),
        ("git status", Allow),
        ("git diff HEAD~1", Allow),
        ("ls -la reports", Allow),
        ("cat prompts/digest.md", Allow),
        ("echo hello > reports/x.md", Allow),
        // A recursive search would read `.env`, which `Read(**/.env)` denies (the Read
        // rules hold for shell reads too); a search of named files is fine.
        ("grep -rn TODO . | wc -l", Deny),
        ("grep -n TODO README.md | wc -l", Allow),
        ("date", Allow),
        ("cd reports && ls", Allow),
        ("git log | head -n 3 | sort", Allow),
    ]);
}

#[test]
fn unknown_commands_are_denied_by_default() {
    check(&[
        ("whoami", Deny),
        ("git status --short", Deny),
        ("date -s now", Deny),
        ("git commit -m x", Deny),
        ("npm install", Deny),
    ]);
}

#[test]
fn rm_flag_reordering() {
    check(&[
        ("rm -rf reports/tmp", Deny),
        ("rm -fr reports/tmp", Deny),
        ("rm -r -f reports/tmp", Deny),
        ("rm --recursive --force reports/tmp", Deny),
        ("rm -R -f reports/tmp", Deny),
        ("rm -v -rf reports/tmp", Deny),
        ("/bin/rm -rf reports/tmp", Deny),
        ("rm reports/old.md", Allow),
        ("rm -f reports/old.md", Allow),
        ("rm prompts/digest.md", Deny),
    ]);
}

#[test]
fn chaining_and_git_push() {
    check(&[
        ("cd x && git push", Deny),
        ("git log; git push", Deny),
        ("git log || git push origin main", Deny),
        ("git log & git push", Deny),
        ("git log\ngit push", Deny),
        ("git -C . push", Deny),
        ("git -c core.x=y --no-pager push --force", Deny),
        ("ls | git push", Deny),
        ("(git push)", Deny),
        ("{ git push; }", Deny),
    ]);
}

#[test]
fn env_prefixes_and_wrappers() {
    check(&[
        ("FOO=1 git push", Deny),
        ("env git push", Deny),
        ("env -i PATH=/bin git push", Deny),
        ("env -u HOME -C . git push", Deny),
        ("timeout 5 git push", Deny),
        ("timeout -s KILL 5s rm -rf x", Deny),
        ("nice -n 10 git push", Deny),
        ("nohup git push", Deny),
        ("command git push", Deny),
        ("builtin eval 'git push'", Deny),
        ("exec git push", Deny),
        ("sudo ls", Deny),
        ("stdbuf -oL git push", Deny),
        ("timeout 5 git log", Allow),
        ("env LANG=C git log", Allow),
        ("nice git log --oneline", Allow),
    ]);
}

#[test]
fn nested_shells_and_eval() {
    check(&[
        ("bash -c 'git push'", Deny),
        ("sh -c \"rm -rf reports\"", Deny),
        ("bash -lc 'cd x; git push'", Deny),
        ("bash -c \"bash -c 'git push'\"", Deny),
        ("eval git push", Deny),
        ("eval 'rm -fr x'", Deny),
        ("bash -c \"$CMD\"", Deny),
        ("sh -c 'echo hi > prompts/x.md'", Deny),
        ("bash -c 'git log'", Allow),
    ]);
}

#[test]
fn substitutions() {
    check(&[
        ("echo $(git push)", Deny),
        ("echo `rm -rf x`", Deny),
        ("cat <(git push)", Deny),
        ("echo \"$(rm -fr /)\"", Deny),
        ("X=$(git push) ls", Deny),
        ("$(echo rm) -rf x", Deny),
        ("echo $(date)", Allow),
    ]);
}

#[test]
fn heredocs_and_redirections() {
    check(&[
        ("cat <<EOF > prompts/digest.md\nhacked\nEOF", Deny),
        ("bash <<EOF\ngit push\nEOF", Deny),
        ("sh <<< 'rm -rf x'", Deny),
        ("echo x >> settings/runtime.yaml", Deny),
        ("echo x > scope/SCOPE.md 2>&1", Deny),
        ("echo x &> .git/config", Deny),
        ("echo x > /etc/passwd", Deny),
        ("echo x > ../outside.txt", Deny),
        ("echo x > README.md", Deny),
        ("cat <<EOF > reports/a.md\nfine\nEOF", Allow),
        ("echo x > /dev/null", Allow),
        ("echo x 2>/dev/null >> reports/log.md", Allow),
        ("echo x > $OUT", Deny),
    ]);
}

#[test]
fn interpreters_with_inline_code() {
    check(&[
        ("python3 -c \"open('prompts/x.md','w').write('x')\"", Deny),
        ("python3 -c 'import os; os.remove(\"settings/runtime.yaml\")'", Deny),
        ("perl -e 'unlink \"tools/a.sh\"'", Deny),
        ("python3 <<EOF\nopen('scope/SCOPE.md','w')\nEOF", Deny),
        ("python3 -c 'print(1+1)'", Allow),
        ("node -e 'require(\"fs\").rmSync(\"prompts\")'", Deny),
    ]);
}

#[test]
fn sed_in_place_with_several_targets() {
    check(&[
        ("sed -i 's/a/b/' reports/a.md prompts/digest.md", Deny),
        ("sed -i -e 's/a/b/' reports/a.md settings/runtime.yaml", Deny),
        ("sed --in-place 's/a/b/' reports/a.md scope/SCOPE.md", Deny),
        ("sed -i.bak 's/a/b/' reports/a.md tools/x.sh", Deny),
        ("sed -i 's/a/b/' reports/a.md reports/b.md", Allow),
        ("sed 's/a/b/' prompts/digest.md", Allow),
    ]);
}

#[test]
fn write_commands_and_path_tricks() {
    check(&[
        ("cp reports/a.md prompts/", Deny),
        ("cp -t prompts reports/a.md", Deny),
        ("mv prompts/digest.md reports/", Deny),
        ("mv reports/a.md reports/b.md", Allow),
        ("touch reports/../prompts/x", Deny),
        ("touch reports//..//prompts/x", Deny),
        ("touch /repo/prompts/x", Deny),
        ("touch ./prompts/../prompts/x", Deny),
        ("touch reports/ok.md", Allow),
        ("cd prompts && touch x", Deny),
        ("cd reports && touch ../prompts/x", Deny),
        ("cd reports && touch x", Allow),
        ("mkdir -p tools/new", Deny),
        ("ln -s ../prompts reports/link", Allow),
        ("ln -sf reports/x prompts/digest.md", Deny),
        ("truncate -s 0 prompts/digest.md", Deny),
        ("dd if=/dev/zero of=settings/runtime.yaml", Deny),
        ("tar -xf reports/a.tar -C prompts", Deny),
        ("tar xf reports/a.tar", Deny),
        ("find prompts -delete", Deny),
        ("find . -name '*.md' -exec rm {} \\;", Deny),
        ("find prompts -name x -exec rm {} +", Deny),
        ("find reports -name '*.tmp' -delete", Allow),
        ("ls reports | xargs rm -rf", Deny),
        ("xargs -I{} cp {} prompts/", Deny),
        ("touch p*/x", Deny),
        ("touch {prompts,reports}/x", Deny),
        ("touch docs/policy/a.md", Deny),
        ("rm -r .", Deny),
        ("tee prompts/x < reports/a.md", Deny),
        ("chmod +x reports/a.sh", Deny),
    ]);
}

#[test]
fn quoting_and_backslash_tricks() {
    check(&[
        ("g\\it push", Deny),
        ("'git' 'push'", Deny),
        ("\"rm\" \"-rf\" x", Deny),
        ("$'\\x67it' push", Deny),
        ("git p\"\"ush", Deny),
        ("r\\m -r\\f x", Deny),
    ]);
}

#[test]
fn unparseable_commands_are_denied() {
    let p = policy();
    for cmd in ["echo 'unterminated", "ls &&", "if then", "$X", "cat <<", ")"] {
        let v = p.decide(Call::RunCommand(cmd));
        assert_eq!(v.decision, Deny, "{cmd}: {v:?}");
    }
    let v = p.decide(Call::RunCommand("echo 'x"));
    assert!(v.reason.contains("cannot understand"), "{}", v.reason);
}

#[test]
fn ask_rules_pause() {
    check(&[
        ("curl https://example.com", Ask),
        ("ls && curl -s x", Ask),
        ("curl x && git push", Deny),
    ]);
}

#[test]
fn file_tools() {
    let p = policy();
    let cases: &[(Call, Decision)] = &[
        (Call::ReadFile("prompts/digest.md"), Allow),
        (Call::ReadFile("/etc/passwd"), Deny),
        (Call::ReadFile("config/.env"), Deny),
        (Call::ReadFile("../other/x"), Deny),
        (Call::ListDir("."), Allow),
        (Call::Grep("reports"), Allow),
        (Call::WriteFile("reports/a.md"), Allow),
        (Call::WriteFile("cards/x.yaml"), Allow),
        (Call::WriteFile("runs/x.json"), Deny),
        (Call::WriteFile("prompts/digest.md"), Deny),
        (Call::WriteFile("./prompts/../prompts/x"), Deny),
        (Call::WriteFile("reports/../prompts/x"), Deny),
        (Call::WriteFile("reports//../settings/runtime.yaml"), Deny),
        (Call::WriteFile("/repo/prompts/x"), Deny),
        (Call::WriteFile("/repo/reports/a.md"), Allow),
        (Call::WriteFile("/tmp/x"), Deny),
        (Call::WriteFile("reports/a\0.md"), Deny),
        (Call::EditFile(".git/config"), Deny),
        (Call::EditFile("reports/drafts/a.md"), Ask),
        (Call::WriteFile("README.md"), Deny),
    ];
    for (call, want) in cases {
        let v = p.decide(*call);
        assert_eq!(v.decision, *want, "{call:?}: {v:?}");
    }
}

#[test]
fn verdicts_name_the_matching_rule() {
    let p = policy();
    let v = p.decide(Call::RunCommand("rm -fr x"));
    assert_eq!(v.rule.as_deref(), Some("Bash(rm -rf*)"));
    let v = p.decide(Call::RunCommand("git log -1"));
    assert_eq!(v.rule.as_deref(), Some("Bash(git log*)"));
    let v = p.decide(Call::WriteFile("prompts/x"));
    assert!(v.reason.contains("builder-owned"), "{}", v.reason);
}

#[test]
fn default_ask_applies_to_unmatched_calls() {
    let perms = Permissions {
        default: DefaultDecision::Ask,
        ..Permissions::default()
    };
    let p = Policy::new(Path::new("/repo"), &perms, &[]).unwrap();
    assert_eq!(p.decide(Call::RunCommand("whoami")).decision, Ask);
    assert_eq!(p.decide(Call::WriteFile("prompts/x")).decision, Deny);
}

#[test]
fn scratch_dir_is_writable() {
    let p = policy().with_scratch("/tmp/run-1");
    assert_eq!(p.decide(Call::RunCommand("echo x > /tmp/run-1/a")).decision, Allow);
    assert_eq!(p.decide(Call::RunCommand("echo x > /tmp/run-1/../x")).decision, Deny);
}

#[test]
fn read_deny_rules_hold_for_shell_reads() {
    check(&[
        ("cat .env", Deny),
        ("cat sub/dir/.env", Deny),
        ("head -n 3 .env", Deny),
        ("grep KEY .env", Deny),
        ("grep -e KEY .env", Deny),
        ("sed -n 1p .env", Deny),
        ("cat < .env", Deny),
        ("wc -l < sub/.env", Deny),
        ("cp .env reports/leak.txt", Deny),
        ("cat README.md | grep KEY", Allow),
        ("grep .env README.md", Allow),
        ("cat $FILE", Deny),
        ("cat *", Deny),
        ("cat README.md", Allow),
        ("head -n 3 README.md", Allow),
        ("grep -r KEY .", Deny),
        ("grep -rn KEY src", Deny),
        ("grep --recursive KEY", Deny),
        ("rg KEY", Deny),
        ("rg KEY src", Deny),
        ("ag KEY .", Deny),
        ("grep -n KEY README.md", Allow),
    ]);
}

/// A deny (or ask) rule for any depth holds in the read roots outside the repository
/// (helper-84: `Read(**/.env)` did not stop `read_file` or `cat` of a read root's
/// `.env`); an allow rule for any depth does not reach outside the read roots.
#[test]
fn deny_rules_for_any_depth_hold_in_the_read_roots() {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let perms = Permissions {
        allow: s(&["Read(**/*.md)", "Bash(cat*)"]),
        deny: s(&["Read(**/.env)", "Read(//srv/data/secret/**)"]),
        additional_directories: s(&["/srv/data"]),
        ..Permissions::default()
    };
    let p = Policy::new(Path::new("/repo"), &perms, &[]).unwrap();
    let cases: &[(Call, Decision)] = &[
        (Call::ReadFile("/srv/data/.env"), Deny),
        (Call::ReadFile("/srv/data/deep/er/.env"), Deny),
        (Call::ReadFile("/srv/data/secret/key"), Deny),
        (Call::ReadFile("/srv/data/notes.txt"), Allow),
        (Call::RunCommand("cat /srv/data/.env"), Deny),
        (Call::RunCommand("cat /srv/data/notes.txt"), Allow),
        (Call::ReadFile("config/.env"), Deny),
        (Call::ReadFile("/etc/x.md"), Deny),
    ];
    for (call, want) in cases {
        let v = p.decide(*call);
        assert_eq!(v.decision, *want, "{call:?}: {v:?}");
    }
    // An ask rule for any depth holds in the read roots, not across the host: a path
    // outside them keeps the default (deny), never a pause.
    let perms = Permissions {
        allow: s(&["Bash(cat*)"]),
        ask: s(&["Read(**/*.md)"]),
        additional_directories: s(&["/srv/data"]),
        ..Permissions::default()
    };
    let p = Policy::new(Path::new("/repo"), &perms, &[]).unwrap();
    let cases: &[(Call, Decision)] = &[
        (Call::ReadFile("/srv/data/x.md"), Ask),
        (Call::ReadFile("/etc/x.md"), Deny),
        (Call::ReadFile("notes/x.md"), Ask),
    ];
    for (call, want) in cases {
        let v = p.decide(*call);
        assert_eq!(v.decision, *want, "{call:?}: {v:?}");
    }
}
