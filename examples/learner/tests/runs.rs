//! Builds and runs the `learner` program on the CPU (its three epochs, about
//! a second) and checks what it prints: the first step's loss near `ln 256`,
//! a falling loss epoch by epoch, no parameter left off the host, and every
//! training step's blocks recomputed in its backward (the type parameter's
//! checkpoints). The
//! program's own `#[cfg(test)]` module checks `train`'s report in more
//! detail; this checks the program a user runs.

use std::process::Command;

/// The number after `key` in `line`, up to the next space or comma.
fn number_after(line: &str, key: &str) -> f64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line:?}"))
        + key.len();
    let text: String = line[at..]
        .chars()
        .take_while(|c| !matches!(c, ' ' | ',' | ';'))
        .collect();
    text.parse()
        .unwrap_or_else(|_| panic!("not a number after {key:?}: {line:?}"))
}

#[test]
fn the_learner_program_trains_on_offload() {
    let output = Command::new(env!("CARGO_BIN_EXE_learner"))
        .output()
        .expect("cannot start learner");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "learner failed: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    // `N steps in T s; first step's loss F (ln 256 = U)`
    let first = stdout
        .lines()
        .find(|line| line.contains("first step's loss"))
        .map(|line| number_after(line, "first step's loss "))
        .unwrap_or_else(|| panic!("no first loss:\n{stdout}"));
    let uniform = 256f64.ln();
    assert!(
        (first - uniform).abs() < 0.2,
        "an untrained model starts near ln 256 = {uniform:.3}, not {first}:\n{stdout}"
    );

    // `epoch E: train loss X, valid loss Y`
    let epochs: Vec<(f64, f64)> = stdout
        .lines()
        .filter(|line| line.starts_with("epoch "))
        .map(|line| {
            (
                number_after(line, "train loss "),
                number_after(line, "valid loss "),
            )
        })
        .collect();
    assert_eq!(epochs.len(), 3, "one line per epoch:\n{stdout}");
    assert!(
        epochs.windows(2).all(|w| w[1].0 < w[0].0),
        "training loss not falling epoch by epoch:\n{stdout}"
    );
    let last = epochs[epochs.len() - 1].1;
    assert!(
        last < 0.5 * first,
        "loss did not fall: {first} -> {last}:\n{stdout}"
    );

    assert!(
        stdout.contains("parameters off the host: 0 at step starts, 0 of"),
        "parameters left off the host:\n{stdout}"
    );

    // `blocks recomputed in the backward: N; …`: the type parameter ran
    // each training step's blocks as checkpoints (two blocks a step).
    let recomputed = stdout
        .lines()
        .find(|line| line.starts_with("blocks recomputed"))
        .map(|line| number_after(line, "backward: ").trunc())
        .unwrap_or_else(|| panic!("no recompute count:\n{stdout}"));
    let steps = stdout
        .lines()
        .find(|line| line.contains("first step's loss"))
        .map(|line| line.split(' ').next().unwrap_or_default().parse::<f64>())
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no step count:\n{stdout}"));
    assert_eq!(
        recomputed,
        2.0 * steps,
        "every training step recomputes the tiny Llama's two blocks:\n{stdout}"
    );
}
