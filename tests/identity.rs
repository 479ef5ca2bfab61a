//! Who is acting (docs/design.md): a builder command records the
//! person git would name as the author: `GIT_AUTHOR_NAME`/`EMAIL`, then `user.name`
//! and `user.email` from git's config chain (`GIT_CONFIG_GLOBAL`, the repository's
//! config). Nothing is guessed from `$USER`.

use crate::util::*;

/// A repo with one card (an `unreviewed_changes` card from a refused fire); its id.
fn repo_with_a_card() -> (TestEnv, String) {
    let env = TestEnv::new();
    env.write("prompts/digest.md", "---\n---\nchanged but not committed\n");
    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 1, "{stderr}");
    let id = summary["cards"][0].as_str().expect("a card").to_string();
    (env, id)
}

/// `builder cards triage <id> --accept` with the author variables removed and
/// `extra` variables set; returns the `by:` recorded in the card.
fn triage_by(env: &TestEnv, id: &str, extra: &[(&str, &str)]) -> Result<String, String> {
    let mut cmd = env.command("builder", &["cards", "triage", id, "--accept"]);
    cmd.env_remove("GIT_AUTHOR_NAME")
        .env_remove("GIT_AUTHOR_EMAIL")
        .env("USER", "someone-else");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.code() != Some(0) {
        return Err(format!(
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let by = stdout
        .lines()
        .find_map(|l| l.split(" by ").nth(1))
        .unwrap_or_else(|| panic!("no `by` in {stdout}"));
    Ok(by.to_string())
}

#[test]
fn the_acting_identity_follows_git() {
    let (env, id) = repo_with_a_card();

    // No identity anywhere: a clear configuration error, not `$USER`.
    let err = triage_by(&env, &id, &[]).unwrap_err();
    assert!(err.starts_with("exit Some(2)"), "{err}");
    assert!(
        err.contains("hint: tell git who you are: git config user.name"),
        "{err}"
    );
    assert!(!err.contains("someone-else"), "{err}");

    // GIT_CONFIG_GLOBAL names the global config file, as for git.
    let global = env.home.join("global.gitconfig");
    std::fs::write(
        &global,
        "[user]\n\tname = Global Person\n\temail = global@example.com\n",
    )
    .unwrap();
    let global = global.to_str().unwrap();
    assert_eq!(
        triage_by(&env, &id, &[("GIT_CONFIG_GLOBAL", global)]).unwrap(),
        "Global Person <global@example.com>"
    );

    // The repository's config wins over the global one.
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut cfg = repo.config().unwrap().open_level(git2::ConfigLevel::Local).unwrap();
    cfg.set_str("user.name", "Repo Person").unwrap();
    cfg.set_str("user.email", "repo@example.com").unwrap();
    assert_eq!(
        triage_by(&env, &id, &[("GIT_CONFIG_GLOBAL", global)]).unwrap(),
        "Repo Person <repo@example.com>"
    );

    // GIT_AUTHOR_NAME / GIT_AUTHOR_EMAIL win over any config.
    assert_eq!(
        triage_by(
            &env,
            &id,
            &[
                ("GIT_CONFIG_GLOBAL", global),
                ("GIT_AUTHOR_NAME", "Env Person"),
                ("GIT_AUTHOR_EMAIL", "env@example.com")
            ]
        )
        .unwrap(),
        "Env Person <env@example.com>"
    );
    let card = std::fs::read_dir(env.root.join("cards"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join(format!("{id}.yaml")))
        .find(|p| p.exists())
        .unwrap();
    let text = std::fs::read_to_string(card).unwrap();
    assert!(text.contains("Env Person <env@example.com>"), "{text}");
}

#[test]
fn approve_call_without_an_identity_is_refused() {
    let env = TestEnv::new();
    let out = env
        .command("builder", &["approve-call", "some-run", "c0"])
        .env_remove("GIT_AUTHOR_NAME")
        .env_remove("GIT_AUTHOR_EMAIL")
        .env("USER", "someone-else")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("hint: or name the person: --by \"Name <email>\""),
        "{stderr}"
    );
}
