//! Example trainers for weft; run them with `cargo run --release -p weft-examples --example NAME`.
//!
//! - `train_loop`: the README's example, a short training loop of a ResNet on the CPU (the
//!   test below keeps the README's code block and the example identical).
//! - `ddp_threads`: data-parallel training with ranks as threads over the shared-memory
//!   backend: the trainer under `DistributedDataParallel`.

#[cfg(test)]
mod tests {
    /// The lines of `text` between the `// readme: begin` and `// readme: end` markers, with
    /// their common indentation removed.
    fn marked(text: &str) -> Vec<String> {
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("readme: begin"))
            .skip(1)
            .take_while(|l| !l.contains("readme: end"))
            .collect();
        let indent = lines
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        lines
            .iter()
            .map(|l| l.get(indent..).unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn the_readme_shows_the_example_that_ci_builds() {
        let example = include_str!("train_loop.rs");
        let readme = include_str!("../README.md");
        let body = marked(example);
        assert!(body.len() > 10, "the example lost its markers");
        let block = body.join("\n");
        assert!(
            readme.contains(&block),
            "README.md's code block differs from examples/train_loop.rs:\n{block}"
        );
    }
}
