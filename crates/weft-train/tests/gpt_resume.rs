//! `train-gpt --save-every/--resume`: a run resumed from its step-3 checkpoint logs the losses
//! of the uninterrupted run for the steps after it, bit for bit (dropout on, so the masks'
//! step counter is restored too): one process, and two thread ranks under ZeRO-1, ZeRO-3, TP 2
//! and PP 2. A checkpoint resumes in a run split another way (`--tp`, `--pp`, ZeRO replicas).
//! `--keep-last` keeps the newest checkpoints, and bad uses are one-line errors.

use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use weft_testing::on_thread_ranks;
use weft_train::distributed::RankContext;
use weft_train::GptArgs;

mod support;
use support::{run, values};

fn flags(out: &Path, extra: &[&str]) -> GptArgs {
    let base = [
        "--steps",
        "6",
        "--dropout",
        "0.1",
        "--out",
        out.to_str().unwrap(),
    ];
    support::tiny(&[&base[..], extra].concat())
}

fn losses(run: &Path) -> Vec<f64> {
    values(run, "loss")
}

#[test]
fn resumed_runs_log_the_uninterrupted_losses() {
    let out = tempfile::tempdir().unwrap();
    for (case, ranks, layout) in [
        ("one", 1, &[][..]),
        ("zero1", 2, &["--nproc", "2", "--zero", "1"][..]),
        ("zero3", 2, &["--nproc", "2", "--zero", "3"][..]),
        ("tp2", 2, &["--nproc", "2", "--tp", "2"][..]),
        ("pp2", 2, &["--nproc", "2", "--pp", "2"][..]),
    ] {
        let named = |name: String, more: &[&str]| {
            let mut extra: Vec<&str> = layout.to_vec();
            extra.extend(["--name", &name]);
            extra.extend_from_slice(more);
            flags(out.path(), &extra)
        };
        let (straight, saved) = (format!("{case}-straight"), format!("{case}-saved"));
        run(&named(straight.clone(), &[]), ranks);
        run(&named(saved.clone(), &["--save-every", "3"]), ranks);
        let expected = losses(&out.path().join(&straight));
        assert_eq!(losses(&out.path().join(&saved)), expected, "{case}: saving");
        // Resume from the step-3 checkpoint: steps 3..5 again, from the checkpoint alone.
        let checkpoint = out.path().join(&saved).join("checkpoints/step-00000003");
        let resumed = named(saved.clone(), &["--resume", checkpoint.to_str().unwrap()]);
        run(&resumed, ranks);
        assert_eq!(
            losses(&out.path().join(&saved)),
            expected,
            "{case}: resumed"
        );
        // The epoch line counts the steps before the checkpoint too (it falls inside the epoch).
        let epoch = |name: &str| values(&out.path().join(name), "train_loss");
        assert_eq!(epoch(&saved), epoch(&straight), "{case}: epoch line");
        assert_eq!(epoch(&straight).len(), 1, "{case}");
        assert_eq!(expected.len(), 6);
    }
}

#[test]
fn keep_last_keeps_the_newest_and_bad_uses_are_one_line_errors() {
    let out = tempfile::tempdir().unwrap();
    let args = flags(
        out.path(),
        &["--name", "k", "--save-every", "2", "--keep-last", "2"],
    );
    weft_train::gpt::run(&args).unwrap();
    let mut kept: Vec<String> = std::fs::read_dir(out.path().join("k/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["step-00000004", "step-00000006"]);
    // Resuming the finished run's folder takes its newest checkpoint and has nothing to do.
    let again = flags(
        out.path(),
        &["--resume", out.path().join("k").to_str().unwrap()],
    );
    weft_train::gpt::run(&again).unwrap();
    assert_eq!(losses(&out.path().join("k")).len(), 6);
    for (extra, expected) in [
        (&["--keep-last", "2"][..], "--keep-last needs --save-every"),
        (
            &["--save-every", "0"][..],
            "--save-every and --keep-last must be at least 1",
        ),
        (
            &["--resume", "/nonexistent/run"][..],
            "--resume /nonexistent/run: neither a checkpoint",
        ),
    ] {
        let err = weft_train::gpt::run(&flags(out.path(), extra))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{extra:?}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

/// The errors of every rank of a `ranks`-rank job run with `args`, which must all fail, with
/// the same one-line message; that message.
fn refusal(args: &GptArgs, ranks: usize) -> String {
    let errors = std::sync::Mutex::new(Vec::new());
    on_thread_ranks(ranks, |rank, comm| {
        let ctx = RankContext {
            rank,
            world_size: ranks,
            comm: Some(comm as Arc<_>),
        };
        let err = weft_train::gpt::run_in(args, &ctx, &Device::Cpu).unwrap_err();
        errors.lock().unwrap().push(err.to_string());
    });
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.iter().all(|e| *e == errors[0] && !e.contains('\n')),
        "{errors:?}"
    );
    errors[0].clone()
}

/// A checkpoint holding an entry the model has not (another model) is refused by a run that
/// cuts it anew (a pipeline stage holds a part of the model's entries only, so the stages check
/// together that one of them holds each), in one line naming the checkpoint and the entry;
/// nothing is written into the model first.
#[test]
fn a_checkpoint_of_another_model_is_refused_naming_the_entry() {
    let out = tempfile::tempdir().unwrap();
    let more = ["--name", "m", "--steps", "2", "--save-every", "2"];
    run(&flags(out.path(), &more), 1);
    let checkpoint = out.path().join("m/checkpoints/step-00000002");
    let model = checkpoint.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&model, &Device::Cpu).unwrap();
    let extra = tensors["transformer.h.0.ln_1.weight"].clone();
    tensors.insert("transformer.h.4.ln_1.weight".into(), extra);
    candle_core::safetensors::save(&tensors, &model).unwrap();
    for layout in [&["--pp", "2"][..], &["--tp", "2"][..]] {
        let resume = [
            "--nproc",
            "2",
            "--resume",
            checkpoint.to_str().unwrap(),
            "--steps",
            "3",
        ];
        let err = refusal(&flags(out.path(), &[layout, &resume[..]].concat()), 2);
        assert!(
            err.ends_with("m/checkpoints/step-00000002: holds transformer.h.4.ln_1.weight, which this model has not"),
            "{layout:?}: {err}"
        );
    }
}

/// A checkpoint resumes in a run split another way than the run that wrote it — another
/// `--tp` (none, 2, 4), another `--pp` (none, 2, 4), both, another number of replicas under
/// ZeRO — and in the same TP 2 × PP 2 split (each stage's slices read back as written); its model, AdamW moments and master weights read whole by name and cut anew (the last
/// stage's copy of the tied token table is the first's). The steps after it follow the
/// uninterrupted one-process run within f32 rounding (1e-5 relative: the same math, with sums
/// split over ranks and added in other orders); without dropout, whose masks are drawn per
/// slice.
#[test]
fn a_checkpoint_resumes_in_any_split() {
    let out = tempfile::tempdir().unwrap();
    let no_dropout = ["--dropout", "0"];
    run(
        &flags(out.path(), &["--name", "straight", "--dropout", "0"]),
        1,
    );
    let expected = losses(&out.path().join("straight"));
    let layouts: [(&str, usize, &[&str]); 4] = [
        ("one", 1, &[]),
        ("tp2", 2, &["--nproc", "2", "--tp", "2"]),
        ("pp2", 2, &["--nproc", "2", "--pp", "2"]),
        ("tp2pp2", 4, &["--nproc", "4", "--tp", "2", "--pp", "2"]),
    ];
    let with = |layout: &[&str], more: &[&str]| {
        flags(out.path(), &[layout, &no_dropout[..], more].concat())
    };
    for (name, ranks, layout) in layouts {
        let saving = ["--name", name, "--save-every", "3"];
        run(&with(layout, &saving), ranks);
    }
    let cases: [(&str, usize, &[&str]); 9] = [
        ("one", 4, &["--nproc", "4", "--tp", "2", "--pp", "2"]),
        ("tp2", 2, &["--nproc", "2", "--pp", "2"]),
        ("tp2", 4, &["--nproc", "4", "--tp", "4"]),
        ("tp2", 1, &[]),
        ("pp2", 2, &["--nproc", "2", "--tp", "2"]),
        ("pp2", 4, &["--nproc", "4", "--pp", "4"]),
        ("tp2pp2", 1, &[]),
        ("tp2pp2", 4, &["--nproc", "4", "--tp", "2", "--pp", "2"]),
        ("tp2pp2", 4, &["--nproc", "4", "--tp", "2", "--zero", "1"]),
    ];
    for (written, ranks, layout) in cases {
        let checkpoint = out.path().join(written).join("checkpoints/step-00000003");
        let resume = ["--resume", checkpoint.to_str().unwrap()];
        run(&with(layout, &resume), ranks);
        let got = losses(&out.path().join(written));
        let what = format!("{written} into {layout:?}");
        assert_eq!(got.len(), 6, "{what}");
        for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                ((g - e) / e).abs() < 1e-5,
                "{what} step {step}: {g} against {e}"
            );
        }
    }
}

/// A resumed command that changes what the run trains (an optimizer hyper-parameter, the
/// model's dropout, the seed) is refused in one line naming the flag, and nothing of the run
/// is touched: its checkpoints and metric lines stay. Changing the steps and the ranks is a
/// resume as any other.
#[test]
fn a_resume_that_changes_what_is_trained_is_refused_and_touches_nothing() {
    let out = tempfile::tempdir().unwrap();
    let more = ["--name", "c", "--steps", "4", "--save-every", "2"];
    run(&flags(out.path(), &more), 1);
    let run_dir = out.path().join("c");
    let checkpoint = run_dir.join("checkpoints/step-00000002");
    let at = checkpoint.to_str().unwrap();
    let before = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    for (changed, expected) in [
        (
            &["--lr", "0.01"][..],
            "--lr 0.01 differs from the checkpoint's run (0.003)",
        ),
        (&["--dropout", "0.2"][..], "--dropout 0.2 differs"),
        (&["--seed", "7"][..], "--seed 7 differs"),
    ] {
        let args = flags(out.path(), &[&["--resume", at][..], changed].concat());
        let err = weft_train::gpt::run(&args).unwrap_err().to_string();
        assert!(
            err.contains(expected) && !err.contains('\n'),
            "{changed:?}: {err}"
        );
        assert!(
            run_dir.join("checkpoints/step-00000004").is_dir(),
            "{changed:?}"
        );
        let after = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
        assert_eq!(after, before, "{changed:?}");
    }
    // Longer, and on two ranks: resumed from step 2, steps 2..5 logged.
    let args = flags(
        out.path(),
        &["--resume", at, "--steps", "6", "--nproc", "2"],
    );
    run(&args, 2);
    assert_eq!(losses(&run_dir).len(), 6);
}

/// A damaged checkpoint: resumed from the run folder, the newest whole one is taken (the
/// damaged one past it is discarded only after that load) and the run logs the uninterrupted
/// run's losses, bit for bit; named explicitly, it is a one-line
/// error and nothing is touched; with no whole one left, an error, never a fresh start.
#[test]
fn a_damaged_checkpoint_is_skipped_from_the_run_folder_and_refused_when_named() {
    let out = tempfile::tempdir().unwrap();
    let more = ["--name", "d", "--steps", "6", "--save-every", "2"];
    run(&flags(out.path(), &more), 1);
    let run_dir = out.path().join("d");
    let step = |n: usize| run_dir.join(format!("checkpoints/step-{n:08}"));
    let truncate = |dir: &Path| {
        let model = dir.join("model.safetensors");
        let bytes = std::fs::read(&model).unwrap();
        std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    };
    let uninterrupted = losses(&run_dir);
    truncate(&step(6));
    let before = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let named = flags(out.path(), &["--resume", step(6).to_str().unwrap()]);
    let err = format!("{:#}", weft_train::gpt::run(&named).unwrap_err());
    assert!(
        err.contains("damaged")
            && err.contains("not a whole safetensors file")
            && !err.contains('\n'),
        "{err}"
    );
    assert!(step(6).is_dir() && step(4).is_dir());
    let after = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(after, before);
    // From the run folder: step 4 is taken, and the run goes on to step 6 again.
    let whole = ["--resume", run_dir.to_str().unwrap(), "--save-every", "2"];
    weft_train::gpt::run(&flags(out.path(), &whole)).unwrap();
    assert_eq!(losses(&run_dir), uninterrupted);
    assert!(step(6).is_dir());
    // Every checkpoint damaged: an error naming them.
    for n in [2, 4, 6] {
        truncate(&step(n));
    }
    let err = weft_train::gpt::run(&flags(out.path(), &whole))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no whole checkpoint (damaged: "), "{err}");
    assert!(step(2).is_dir() && step(6).is_dir());
}
