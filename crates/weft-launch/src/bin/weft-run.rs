//! `weft-run`: starts the ranks of a job on this machine ([`weft_launch::runner`]).

fn main() -> std::process::ExitCode {
    weft_launch::runner::main_from(std::env::args_os())
}
