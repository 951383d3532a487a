//! The GPT trainer as one rank: joins the job the environment describes (or runs alone),
//! with the flags of `cargo xtask train-gpt`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: weft_train::GptArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Cli::parse().args;
    args.validate()?;
    weft_train::gpt::run(&args).map(|_| ())
}
