//! `builder init` and `builder check` from the command line: a clean scaffold passes,
//! and a repo with ten planted problems gets all ten listed with `file:line`.

use crate::util::*;

#[test]
fn init_then_check_is_clean_and_init_is_idempotent() {
    let env = TestEnv::new();
    let out = env.builder(&["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let before = env.builder_snapshot();
    let again = env.builder(&["init", env.root.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
    assert_eq!(env.builder_snapshot(), before);
}

#[test]
fn check_lists_ten_planted_problems() {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        "version: 1\nprovider:\n  kind: openai\n  model: m\n  temperature: 3\npermissions:\n  allow:\n    - \"Bash(git log*\"\n  write:\n    - \"reports/**\"\n    - \"prompts/**\"\n    - \"out/[\"\nbudgets:\n  max_steps: lots\ntools: [read_file, teleport]\n",
    );
    env.write(
        "prompts/wide.md",
        "---\nbudgets:\n  max_tokens: 900000\nprefetch:\n  - name: context\n    run: tools/missing.sh\n---\nWiden.\n",
    );
    env.write("prompts/empty.md", "---\ndescription: nothing below\n---\n\n");
    env.write("prompts/typo.md", "---\ndescripton: typo\n---\nBody.\n");
    std::fs::remove_file(env.root.join("scope/SCOPE.md")).unwrap();
    let out = env.builder(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let expected = [
        "settings/runtime.yaml:5: provider.temperature: unknown field",
        "settings/runtime.yaml:8: permissions.allow: rule `Bash(git log*` does not parse",
        "settings/runtime.yaml:11: permissions.write: write glob `prompts/**` overlaps builder-owned `prompts/`",
        "settings/runtime.yaml:12: permissions.write: invalid glob `out/[`",
        "settings/runtime.yaml:14: budgets.max_steps: invalid type",
        "settings/runtime.yaml:15: tools: unknown tool `teleport`",
        "prompts/wide.md:3: budgets.max_tokens: budget widens",
        "prompts/wide.md:6: prefetch: prefetch script `tools/missing.sh` does not exist",
        "prompts/empty.md:4: body: the prompt body is empty",
        "prompts/typo.md:2: descripton: unknown key",
        "scope/SCOPE.md:0: missing",
    ];
    for e in expected {
        assert!(text.contains(e), "missing `{e}` in:\n{text}");
    }
    assert!(text.contains("11 problem(s)"), "{text}");
}
