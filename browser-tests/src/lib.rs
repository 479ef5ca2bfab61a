//! Nothing to link: the tests live in `tests/`; this crate exists to hold them apart from the e2e binary, with their own dependencies (a WebDriver client).

#![forbid(unsafe_code)]
