//! The help lint both binaries' tests run: every command and argument has help, and
//! no help line ends with a period (clap's own style).

/// Every problem with the help of `cmd` and its subcommands; `path` names `cmd`.
pub fn missing_help(cmd: &clap::Command, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    collect(cmd, path, &mut out);
    out
}

fn collect(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
    if about.trim().is_empty() {
        out.push(format!("`{path}` has no help"));
    } else if about.trim_end().ends_with('.') {
        out.push(format!("`{path}`: help ends with a period: {about}"));
    }
    for arg in cmd.get_arguments() {
        if matches!(arg.get_id().as_str(), "help" | "version") {
            continue;
        }
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        if help.trim().is_empty() {
            out.push(format!("`{path}` argument `{}` has no help", arg.get_id()));
        } else if help.trim_end().ends_with('.') {
            out.push(format!("`{path}` argument `{}`: help ends with a period", arg.get_id()));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        collect(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_help_or_with_a_period_is_named() {
        let cmd = clap::Command::new("x")
            .about("The tool")
            .arg(clap::Arg::new("plain").long("plain"))
            .subcommand(clap::Command::new("sub").about("Does a thing."));
        let problems = missing_help(&cmd, "x");
        assert_eq!(
            problems,
            vec![
                "`x` argument `plain` has no help".to_string(),
                "`x sub`: help ends with a period: Does a thing.".to_string(),
            ]
        );
    }
}
