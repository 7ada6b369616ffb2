//! Builds and runs the `custom-loop` program on the CPU for a few steps and
//! checks what it prints: one loss per step, starting near `ln 256` (an
//! untrained model's uniform guess over the byte vocabulary) and falling.

use std::process::Command;

const STEPS: usize = 20;

/// Runs the program with `flags` and returns its per-step losses and its
/// whole output.
fn run(flags: &[&str]) -> (Vec<f64>, String) {
    let steps = STEPS.to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_custom-loop"))
        .args(["--steps", &steps])
        .args(flags)
        .output()
        .expect("cannot start custom-loop");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "custom-loop {flags:?} failed: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // Lines read `step    N  loss X`.
    let losses = stdout
        .lines()
        .filter(|line| line.starts_with("step "))
        .map(|line| {
            let value = line.rsplit(' ').next().unwrap_or_default();
            value
                .parse()
                .unwrap_or_else(|_| panic!("not a loss line: {line:?}"))
        })
        .collect();
    (losses, stdout)
}

fn assert_falls(losses: &[f64], stdout: &str) {
    assert_eq!(losses.len(), STEPS, "one loss per step:\n{stdout}");
    let (first, last) = (losses[0], losses[STEPS - 1]);
    let uniform = 256f64.ln();
    assert!(
        (first - uniform).abs() < 0.2,
        "an untrained model starts near ln 256 = {uniform:.3}, not {first}:\n{stdout}"
    );
    assert!(
        last < 0.7 * first,
        "loss did not fall: {first} -> {last}:\n{stdout}"
    );
}

#[test]
fn the_loop_trains_on_offload() {
    let (losses, stdout) = run(&[]);
    assert_falls(&losses, &stdout);
    assert!(
        stdout.contains("paged in"),
        "no paging report from the offload run:\n{stdout}"
    );
    // The tiny Llama's two blocks, recomputed in every step's backward.
    let recomputed = format!("; {} blocks recomputed", 2 * STEPS);
    assert!(
        stdout.contains(&recomputed),
        "want {recomputed:?} in the offload run's report:\n{stdout}"
    );
}

#[test]
fn the_same_loop_trains_on_plain_burn() {
    let (losses, stdout) = run(&["--plain"]);
    assert_falls(&losses, &stdout);
}
