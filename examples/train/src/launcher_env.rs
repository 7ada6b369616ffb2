//! This process's place in a run of several, as a cluster launcher gives it
//! in the environment rather than as flags: `torchrun` (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`) or SLURM's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`, the tasks per node, and the job's first node as the
//! rendezvous). `train` reads it only when no rank flag is given.
//!
//! The environment is read through a lookup function, so tests pass a map
//! rather than set the process's own variables.

use crate::processes::{PlaceSource, RankOptions};

/// The rendezvous port of a SLURM run that sets no `MASTER_PORT`: torchrun's
/// default, as `--rendezvous`'s.
pub const DEFAULT_PORT: u16 = 29500;

/// torchrun's variables; any of the first four makes a torchrun place.
const TORCHRUN: [&str; 4] = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];

/// A launcher's variables that do not make a place, each naming its variable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LauncherEnvError {
    #[error("environment variable {missing} is not set, and {set} is (a launcher sets both)")]
    Missing {
        missing: &'static str,
        set: &'static str,
    },
    #[error("environment variable {name} must be a whole number, got {value:?}")]
    NotANumber { name: &'static str, value: String },
    #[error("environment variable {name} must be at least 1, got 0")]
    Zero { name: &'static str },
    #[error("environment variable {name}={value} is not below {bound}={limit}")]
    NotBelow {
        name: &'static str,
        value: usize,
        bound: &'static str,
        limit: usize,
    },
    #[error("environment variable {name}={value} is beyond {bound}={limit}")]
    Beyond {
        name: &'static str,
        value: usize,
        bound: &'static str,
        limit: usize,
    },
    #[error("environment variable MASTER_PORT must be a port, 1 to 65535, got {0}")]
    Port(usize),
    #[error("environment variable {name} has no host in {value:?}")]
    NoHost { name: &'static str, value: String },
}

/// The place the environment gives (`None`: no launcher, or a world of one
/// process, which is a run of one process).
pub fn place_from(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<RankOptions>, LauncherEnvError> {
    let env = Env(&lookup);
    if let Some(set) = TORCHRUN.into_iter().find(|name| env.get(name).is_some()) {
        torchrun(&env, set)
    } else if env.get("SLURM_PROCID").is_some() {
        slurm(&env)
    } else {
        Ok(None)
    }
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// A variable's value; an empty one counts as unset, as shells treat it.
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// A variable that must be set because `set` is.
    fn required(&self, name: &'static str, set: &'static str) -> Result<String, LauncherEnvError> {
        self.get(name)
            .ok_or(LauncherEnvError::Missing { missing: name, set })
    }

    fn number(&self, name: &'static str, set: &'static str) -> Result<usize, LauncherEnvError> {
        parse(name, &self.required(name, set)?)
    }

    fn optional_number(&self, name: &'static str) -> Result<Option<usize>, LauncherEnvError> {
        self.get(name).map(|v| parse(name, &v)).transpose()
    }
}

fn parse(name: &'static str, value: &str) -> Result<usize, LauncherEnvError> {
    value
        .trim()
        .parse()
        .map_err(|_| LauncherEnvError::NotANumber {
            name,
            value: value.to_string(),
        })
}

/// Checks that `value` is below `limit`.
fn below(
    (name, value): (&'static str, usize),
    (bound, limit): (&'static str, usize),
) -> Result<(), LauncherEnvError> {
    if value >= limit {
        return Err(LauncherEnvError::NotBelow {
            name,
            value,
            bound,
            limit,
        });
    }
    Ok(())
}

/// The place of named counts, checked as `--rank` and the others are, but
/// naming the variables; a world of one is no place.
fn place(
    rank: (&'static str, usize),
    world: (&'static str, usize),
    local_rank: (&'static str, usize),
    local_world: (&'static str, usize),
    rendezvous: String,
    source: PlaceSource,
) -> Result<Option<RankOptions>, LauncherEnvError> {
    for (name, value) in [world, local_world] {
        if value == 0 {
            return Err(LauncherEnvError::Zero { name });
        }
    }
    below(rank, world)?;
    if local_world.1 > world.1 {
        return Err(LauncherEnvError::Beyond {
            name: local_world.0,
            value: local_world.1,
            bound: world.0,
            limit: world.1,
        });
    }
    below(local_rank, local_world)?;
    Ok((world.1 > 1).then_some(RankOptions {
        rank: rank.1,
        world_size: world.1,
        rendezvous,
        local_rank: local_rank.1,
        local_world_size: local_world.1,
        source,
    }))
}

/// torchrun's place: `RANK` and `WORLD_SIZE` with `MASTER_ADDR` and
/// `MASTER_PORT` (the local pair defaults as `--local-rank` and
/// `--local-world-size` do: one host). Under torchrun's agent, whose store
/// holds `MASTER_PORT`, the rendezvous is on the port after it.
fn torchrun(env: &Env, set: &'static str) -> Result<Option<RankOptions>, LauncherEnvError> {
    let rank = env.number("RANK", set)?;
    let world = env.number("WORLD_SIZE", set)?;
    let local_rank = env.optional_number("LOCAL_RANK")?;
    let local_world = env.optional_number("LOCAL_WORLD_SIZE")?;
    let (local_rank, local_world) = match (local_rank, local_world) {
        (Some(r), Some(w)) => (r, w),
        (None, None) => (rank, world),
        (Some(_), None) => return Err(missing("LOCAL_WORLD_SIZE", "LOCAL_RANK")),
        (None, Some(_)) => return Err(missing("LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    };
    // A world of one process meets no one.
    let rendezvous = match world {
        0 | 1 => String::new(),
        _ => {
            let addr = env.required("MASTER_ADDR", set)?;
            let master = env.number("MASTER_PORT", set)?;
            // torchrun's agent serves its own store on MASTER_PORT (and
            // says so with TORCHELASTIC_RUN_ID): rank 0 listens on the next.
            let taken = env.get("TORCHELASTIC_RUN_ID").is_some();
            host_port(&addr, port(master + usize::from(taken))?)
        }
    };
    place(
        ("RANK", rank),
        ("WORLD_SIZE", world),
        ("LOCAL_RANK", local_rank),
        ("LOCAL_WORLD_SIZE", local_world),
        rendezvous,
        PlaceSource::Torchrun,
    )
}

fn missing(missing: &'static str, set: &'static str) -> LauncherEnvError {
    LauncherEnvError::Missing { missing, set }
}

fn port(value: usize) -> Result<u16, LauncherEnvError> {
    u16::try_from(value)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(LauncherEnvError::Port(value))
}

/// `host:port`, with an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// srun's place: `SLURM_PROCID` of `SLURM_NTASKS`, `SLURM_LOCALID` of the
/// tasks on this node; rank 0 listens at `MASTER_ADDR` (else the job's
/// first node) on `MASTER_PORT` (else [`DEFAULT_PORT`]).
fn slurm(env: &Env) -> Result<Option<RankOptions>, LauncherEnvError> {
    const SET: &str = "SLURM_PROCID";
    let rank = env.number("SLURM_PROCID", SET)?;
    let world = env.number("SLURM_NTASKS", SET)?;
    let local_rank = env.number("SLURM_LOCALID", SET)?;
    let local_world = match env.optional_number("SLURM_NTASKS_PER_NODE")? {
        Some(n) => ("SLURM_NTASKS_PER_NODE", n),
        None => {
            let spec = env.required("SLURM_TASKS_PER_NODE", SET)?;
            let node = env.optional_number("SLURM_NODEID")?.unwrap_or(0);
            let n = tasks_on_node(&spec, node).ok_or_else(|| LauncherEnvError::NotANumber {
                name: "SLURM_TASKS_PER_NODE",
                value: spec.clone(),
            })?;
            ("SLURM_TASKS_PER_NODE", n)
        }
    };
    let rendezvous = match world {
        0 | 1 => String::new(),
        _ => slurm_rendezvous(env)?,
    };
    place(
        ("SLURM_PROCID", rank),
        ("SLURM_NTASKS", world),
        ("SLURM_LOCALID", local_rank),
        local_world,
        rendezvous,
        PlaceSource::Slurm,
    )
}

/// `MASTER_ADDR` (else the job's first node) and `MASTER_PORT` (else
/// [`DEFAULT_PORT`]).
fn slurm_rendezvous(env: &Env) -> Result<String, LauncherEnvError> {
    let port = match env.get("MASTER_PORT") {
        Some(p) => port(parse("MASTER_PORT", &p)?)?,
        None => DEFAULT_PORT,
    };
    let host = match env.get("MASTER_ADDR") {
        Some(addr) => addr,
        None => {
            let name = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                .into_iter()
                .find(|n| env.get(n).is_some())
                .ok_or(missing("SLURM_JOB_NODELIST", "SLURM_PROCID"))?;
            let list = env.get(name).unwrap_or_default();
            first_host(&list).ok_or(LauncherEnvError::NoHost { name, value: list })?
        }
    };
    Ok(host_port(&host, port))
}

/// The tasks on node `node` of SLURM's `SLURM_TASKS_PER_NODE`
/// (`2(x3),1`: 2 on each of the first three nodes, then 1); the first
/// node's when `node` is beyond the list.
pub fn tasks_on_node(spec: &str, node: usize) -> Option<usize> {
    let mut counts = Vec::new();
    for item in spec.split(',') {
        let (count, times) = match item.trim().split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse().ok()?),
            None => (item.trim(), 1),
        };
        let count: usize = count.parse().ok()?;
        counts.extend(std::iter::repeat_n(count, times));
    }
    counts.get(node).or(counts.first()).copied()
}

/// The first host of a SLURM node list: `node[01-04,07],login` gives
/// `node01`, `rack[1-2]-gpu[3-4]` gives `rack1-gpu3`; `None` for an empty
/// or unbalanced list.
pub fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                // The range's first value: up to its `-`, `,` or `]`.
                let mut first = String::new();
                let mut closed = false;
                let mut in_first = true;
                for c in chars.by_ref() {
                    match c {
                        ']' => {
                            closed = true;
                            break;
                        }
                        '-' | ',' => in_first = false,
                        c if in_first => first.push(c),
                        _ => {}
                    }
                }
                if !closed || first.is_empty() {
                    return None;
                }
                host.push_str(&first);
            }
            ']' => return None,
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn place_of(vars: &[(&str, &str)]) -> Result<Option<RankOptions>, LauncherEnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        place_from(|name| map.get(name).cloned())
    }

    const TORCHRUN_1_OF_2: [(&str, &str); 6] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.5"),
        ("MASTER_PORT", "1234"),
    ];

    #[test]
    fn torchruns_variables_give_the_place() {
        let place = place_of(&TORCHRUN_1_OF_2).unwrap().unwrap();
        assert_eq!(
            place,
            RankOptions {
                rank: 1,
                world_size: 2,
                rendezvous: "10.0.0.5:1234".into(),
                local_rank: 1,
                local_world_size: 2,
                source: PlaceSource::Torchrun,
            }
        );
        assert_eq!(place_of(&[]).unwrap(), None);
        let one = [
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        assert_eq!(place_of(&one).unwrap(), None, "a world of one");
        let v6 = [
            &TORCHRUN_1_OF_2[..4],
            &[("MASTER_ADDR", "::1"), ("MASTER_PORT", "9")],
        ]
        .concat();
        assert_eq!(place_of(&v6).unwrap().unwrap().rendezvous, "[::1]:9");
        let agent = [&TORCHRUN_1_OF_2[..], &[("TORCHELASTIC_RUN_ID", "none")]].concat();
        assert_eq!(
            place_of(&agent).unwrap().unwrap().rendezvous,
            "10.0.0.5:1235",
            "torchrun's store holds MASTER_PORT"
        );
    }

    #[test]
    fn partial_or_malformed_sets_name_the_variable() {
        let without = |name: &str| -> Vec<(&str, &str)> {
            TORCHRUN_1_OF_2
                .iter()
                .filter(|(k, _)| *k != name)
                .copied()
                .collect()
        };
        let with = |name: &'static str, value: &'static str| -> Vec<(&str, &str)> {
            let mut vars = without(name);
            vars.push((name, value));
            vars
        };
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (without("WORLD_SIZE"), "WORLD_SIZE is not set, and RANK is"),
            (without("MASTER_ADDR"), "MASTER_ADDR is not set"),
            (without("MASTER_PORT"), "MASTER_PORT is not set"),
            (without("LOCAL_RANK"), "LOCAL_RANK is not set"),
            (with("RANK", "2"), "RANK=2 is not below WORLD_SIZE=2"),
            (with("RANK", "x"), "RANK must be a whole number, got \"x\""),
            (with("WORLD_SIZE", "0"), "WORLD_SIZE must be at least 1"),
            (
                with("LOCAL_WORLD_SIZE", "3"),
                "LOCAL_WORLD_SIZE=3 is beyond",
            ),
            (with("MASTER_PORT", "70000"), "MASTER_PORT must be a port"),
            (
                vec![("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")],
                "SLURM_NTASKS is not set, and SLURM_PROCID is",
            ),
            (
                vec![
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_LOCALID", "0"),
                    ("SLURM_TASKS_PER_NODE", "2"),
                    ("SLURM_JOB_NODELIST", "node[01"),
                ],
                "SLURM_JOB_NODELIST has no host",
            ),
        ];
        for (vars, why) in cases {
            let error = place_of(&vars).unwrap_err().to_string();
            assert!(error.contains(why), "{vars:?}: {error}");
        }
    }

    #[test]
    fn sruns_variables_give_the_place() {
        let vars = [
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ];
        let place = place_of(&vars).unwrap().unwrap();
        assert_eq!((place.rank, place.world_size, place.local_rank), (3, 4, 1));
        assert_eq!(place.local_world_size, 2);
        assert_eq!(place.rendezvous, format!("gpu07:{DEFAULT_PORT}"));
        assert_eq!(place.source, PlaceSource::Slurm);
        let master = [("MASTER_ADDR", "head"), ("MASTER_PORT", "555")];
        let both = [&vars[..], &master[..]].concat();
        assert_eq!(place_of(&both).unwrap().unwrap().rendezvous, "head:555");
        let per_node = [&vars[..], &[("SLURM_NTASKS_PER_NODE", "1")]].concat();
        let error = place_of(&per_node).unwrap_err().to_string();
        assert!(
            error.contains("SLURM_LOCALID=1 is not below SLURM_NTASKS_PER_NODE=1"),
            "{error}"
        );
    }

    #[test]
    fn node_lists_give_their_first_host() {
        for (list, first) in [
            ("node01", Some("node01")),
            ("node[01-04],other", Some("node01")),
            ("node[07,01-02]", Some("node07")),
            ("login,node[1-2]", Some("login")),
            ("rack[1-2]-gpu[3-4]", Some("rack1-gpu3")),
            ("a-b.example.org", Some("a-b.example.org")),
            ("", None),
            ("node[01-04", None),
            ("node[]", None),
            ("node]", None),
        ] {
            assert_eq!(first_host(list).as_deref(), first, "{list:?}");
        }
    }

    #[test]
    fn tasks_per_node_expands_repeats() {
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 9), Some(2));
        assert_eq!(tasks_on_node("x", 0), None);
        assert_eq!(tasks_on_node("2(x", 0), None);
    }
}
