//! End-to-end tests: drive the real `runtime` and `builder` binaries against temporary
//! git repositories, model providers played by an HTTP server on 127.0.0.1 speaking
//! the real wire formats, SQLite on disk and Landlock in the real kernel.

mod util;

mod builder_cmds;
mod docs;
mod escape;
mod exit_codes;
mod fire;
mod identity;
mod init_check;
mod operator;
mod repos;
