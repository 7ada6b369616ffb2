//! The processes of one training run, one per GPU, on one host or several:
//! their rendezvous over TCP at rank 0's address, and the exchange of bytes
//! between them. Each process keeps its own host store and applies the same
//! summed gradients to it.
//!
//! What crosses here is the run's control (the NCCL unique id, a stop
//! agreed by every rank, the check that the stores agree) and, on backends
//! with no collective library (the CPU backends of the tests), the tensors'
//! values themselves: the stand-in for NCCL. On CUDA the gradients go
//! through NCCL, never through these sockets.
//!
//! Ranks 1.. connect to rank 0 (a star): an exchange is each rank's bytes to
//! rank 0, and every rank's bytes, in rank order, back to each. Every rank
//! makes the same exchanges in the same order.

use std::any::Any;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Sent first by each rank that connects: the protocol's mark, then its
/// rank and the world size it was started with.
const HELLO: u64 = 0x6275_726e_6f66_6c31;

/// A failure of the process group.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Ranks are numbered below the world size.
    #[error("rank {rank} is not below the world size {world}")]
    Rank {
        /// The rank given.
        rank: usize,
        /// The world size given.
        world: usize,
    },
    /// Rank 0 could not listen at the rendezvous address.
    #[error("rank 0 cannot listen at rendezvous address `{addr}`: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// A rank did not reach rank 0 (or rank 0 every rank) in time.
    #[error("rendezvous at `{addr}`: {what} within {seconds} s")]
    Timeout {
        /// The address.
        addr: String,
        /// What was still missing.
        what: String,
        /// The time allowed.
        seconds: u64,
    },
    /// A rank that joined disagrees with rank 0 on the group.
    #[error("rendezvous at `{addr}`: {what}")]
    Handshake {
        /// The address.
        addr: String,
        /// What was wrong.
        what: String,
    },
    /// A rank left the group (its process ended, or its link broke).
    #[error("lost the link to rank {rank}: {source}")]
    Lost {
        /// The other end.
        rank: usize,
        /// Why.
        source: io::Error,
    },
    /// The ranks hold different values where they must agree.
    #[error("rank {rank}'s {what} differs from rank 0's")]
    Disagree {
        /// The first rank that differs.
        rank: usize,
        /// What differs.
        what: String,
    },
}

/// This process's place in a run of `world` processes, and its links to the
/// others.
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    /// Rank 0: the link to rank `r` at `r - 1`; other ranks: the link to rank 0.
    links: Mutex<Vec<TcpStream>>,
    /// The device collective's state for this group (the NCCL communicator),
    /// made by the device layer on its first use.
    device: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl ProcessGroup {
    /// Joins the group of `world` processes whose rank 0 listens at `addr`
    /// (`host:port`), as `rank`: rank 0 listens and waits for every other
    /// rank, the others connect (retrying until rank 0 is up), each within
    /// `timeout`.
    pub fn join(
        rank: usize,
        world: usize,
        addr: &str,
        timeout: Duration,
    ) -> Result<Self, ProcessError> {
        if rank >= world {
            return Err(ProcessError::Rank { rank, world });
        }
        let links = if world == 1 {
            Vec::new()
        } else if rank == 0 {
            accept_ranks(world, addr, timeout)?
        } else {
            vec![connect_to_root(rank, world, addr, timeout)?]
        };
        Ok(Self {
            rank,
            world,
            links: Mutex::new(links),
            device: OnceLock::new(),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Every rank's `bytes`, in rank order (this rank's included). Every
    /// rank must call it at the same point of the run.
    pub fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, ProcessError> {
        let mut links = self
            .links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.world == 1 {
            return Ok(vec![bytes.to_vec()]);
        }
        if self.rank == 0 {
            let mut all = Vec::with_capacity(self.world);
            all.push(bytes.to_vec());
            for (r, link) in links.iter_mut().enumerate() {
                all.push(receive(link).map_err(|source| lost(r + 1, source))?);
            }
            for (r, link) in links.iter_mut().enumerate() {
                for part in &all {
                    send(link, part).map_err(|source| lost(r + 1, source))?;
                }
            }
            Ok(all)
        } else {
            let link = &mut links[0];
            send(link, bytes).map_err(|source| lost(0, source))?;
            (0..self.world)
                .map(|_| receive(link).map_err(|source| lost(0, source)))
                .collect()
        }
    }

    /// Rank 0's `bytes` on every rank (the others' arguments are ignored).
    pub fn broadcast(&self, bytes: &[u8]) -> Result<Vec<u8>, ProcessError> {
        let mine = if self.rank == 0 { bytes } else { &[] };
        Ok(self.all_gather(mine)?.swap_remove(0))
    }

    /// Whether any rank says `yes` (every rank learns the same answer).
    pub fn any(&self, yes: bool) -> Result<bool, ProcessError> {
        Ok(self.all_gather(&[yes as u8])?.iter().any(|b| b == &[1]))
    }

    /// Checks that every rank holds the same `value` of `what`.
    pub fn check_agree(&self, what: &str, value: &[u8]) -> Result<(), ProcessError> {
        let all = self.all_gather(value)?;
        match all.iter().position(|v| v != &all[0]) {
            None => Ok(()),
            Some(rank) => Err(ProcessError::Disagree {
                rank,
                what: what.to_string(),
            }),
        }
    }

    /// The device collective's state for this group, made by `init` on the
    /// first call (every rank's first collective on the device is at the
    /// same point of the run, so `init` may exchange bytes with the others).
    /// `None` where it was made with another type.
    pub fn device_state<S: Any + Send + Sync>(&self, init: impl FnOnce() -> S) -> Option<&S> {
        self.device
            .get_or_init(|| Box::new(init()))
            .downcast_ref::<S>()
    }
}

fn lost(rank: usize, source: io::Error) -> ProcessError {
    ProcessError::Lost { rank, source }
}

/// Rank 0's side of the rendezvous: one link per other rank, in rank order.
fn accept_ranks(
    world: usize,
    addr: &str,
    timeout: Duration,
) -> Result<Vec<TcpStream>, ProcessError> {
    let listen_error = |source| ProcessError::Listen {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(listen_error)?;
    listener.set_nonblocking(true).map_err(listen_error)?;
    let deadline = Instant::now() + timeout;
    let mut links: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
    while links.iter().any(Option::is_none) {
        let (mut link, _) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (1..world)
                        .filter(|r| links[r - 1].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    return Err(ProcessError::Timeout {
                        addr: addr.to_string(),
                        what: format!("ranks {} did not join", missing.join(", ")),
                        seconds: timeout.as_secs(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(source) => return Err(listen_error(source)),
        };
        let handshake = |what: String| ProcessError::Handshake {
            addr: addr.to_string(),
            what,
        };
        link.set_nonblocking(false).map_err(listen_error)?;
        link.set_nodelay(true).map_err(listen_error)?;
        let mut hello = [0u8; 24];
        link.read_exact(&mut hello)
            .map_err(|e| handshake(format!("a joining rank sent no greeting: {e}")))?;
        let word = |i: usize| u64::from_le_bytes(hello[8 * i..8 * i + 8].try_into().unwrap());
        let (mark, rank, their_world) = (word(0), word(1) as usize, word(2) as usize);
        if mark != HELLO {
            return Err(handshake(
                "a connection that is not a rank of this run".into(),
            ));
        }
        if their_world != world {
            return Err(handshake(format!(
                "rank {rank} was started with world size {their_world}, rank 0 with {world}"
            )));
        }
        if rank == 0 || rank >= world || links[rank - 1].is_some() {
            return Err(handshake(format!(
                "rank {rank} joined twice or out of range"
            )));
        }
        links[rank - 1] = Some(link);
    }
    let mut links: Vec<TcpStream> = links.into_iter().map(Option::unwrap).collect();
    // Every rank is in: each learns the group is complete.
    for (r, link) in links.iter_mut().enumerate() {
        send(link, &HELLO.to_le_bytes()).map_err(|source| lost(r + 1, source))?;
    }
    Ok(links)
}

/// A rank's side of the rendezvous: the link to rank 0, once the whole
/// group is in.
fn connect_to_root(
    rank: usize,
    world: usize,
    addr: &str,
    timeout: Duration,
) -> Result<TcpStream, ProcessError> {
    let deadline = Instant::now() + timeout;
    let timed_out = |what: &str| ProcessError::Timeout {
        addr: addr.to_string(),
        what: what.to_string(),
        seconds: timeout.as_secs(),
    };
    let mut link = loop {
        let resolved = addr
            .to_socket_addrs()
            .map_err(|source| ProcessError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        if let Some(link) = resolved
            .into_iter()
            .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).ok())
        {
            break link;
        }
        if Instant::now() >= deadline {
            return Err(timed_out("rank 0 did not answer"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    link.set_nodelay(true).map_err(|source| lost(0, source))?;
    let mut hello = Vec::with_capacity(24);
    for word in [HELLO, rank as u64, world as u64] {
        hello.extend_from_slice(&word.to_le_bytes());
    }
    link.write_all(&hello).map_err(|source| lost(0, source))?;
    // Rank 0 answers once every rank has joined.
    link.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))
    .map_err(|source| lost(0, source))?;
    let answer = receive(&mut link).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            timed_out("the other ranks did not all join")
        }
        _ => lost(0, e),
    })?;
    if answer != HELLO.to_le_bytes() {
        return Err(ProcessError::Handshake {
            addr: addr.to_string(),
            what: "rank 0 answered with something else".into(),
        });
    }
    link.set_read_timeout(None)
        .map_err(|source| lost(0, source))?;
    Ok(link)
}

/// Writes one message: its length, then its bytes.
fn send(link: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    link.write_all(&(bytes.len() as u64).to_le_bytes())?;
    link.write_all(bytes)
}

/// Reads one message written by [`send`].
fn receive(link: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    link.read_exact(&mut len)?;
    let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
    link.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free port on the loopback interface.
    fn loopback() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
    }

    fn run_group<T: Send + 'static>(
        world: usize,
        body: impl Fn(ProcessGroup) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let addr = loopback();
        let threads: Vec<_> = (0..world)
            .map(|rank| {
                let (addr, body) = (addr.clone(), body.clone());
                std::thread::spawn(move || {
                    let group = ProcessGroup::join(rank, world, &addr, Duration::from_secs(20))
                        .expect("joins");
                    body(group)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_every_ranks_bytes_in_rank_order() {
        let gathered = run_group(3, |group| {
            let mine = vec![group.rank() as u8; group.rank() + 1];
            let first = group.all_gather(&mine).unwrap();
            let second = group.broadcast(&[7, group.rank() as u8]).unwrap();
            let any = group.any(group.rank() == 2).unwrap();
            let none = group.any(false).unwrap();
            (first, second, any, none)
        });
        for (first, second, any, none) in gathered {
            assert_eq!(first, vec![vec![0], vec![1, 1], vec![2, 2, 2]]);
            assert_eq!(second, vec![7, 0]);
            assert!(any);
            assert!(!none);
        }
    }

    #[test]
    fn disagreement_names_the_rank() {
        let checks = run_group(3, |group| {
            let value = if group.rank() == 2 { b"b" } else { b"a" };
            group.check_agree("store", value).map_err(|e| e.to_string())
        });
        for check in checks {
            assert_eq!(check.unwrap_err(), "rank 2's store differs from rank 0's");
        }
    }

    #[test]
    fn a_bad_rank_or_a_missing_peer_is_an_error() {
        assert!(matches!(
            ProcessGroup::join(2, 2, "127.0.0.1:1", Duration::from_secs(1)),
            Err(ProcessError::Rank { rank: 2, world: 2 })
        ));
        let addr = loopback();
        let error = ProcessGroup::join(0, 2, &addr, Duration::from_millis(200)).unwrap_err();
        assert!(
            error.to_string().contains("ranks 1 did not join"),
            "{error}"
        );
        let error = ProcessGroup::join(1, 2, &addr, Duration::from_millis(300)).unwrap_err();
        assert!(
            error.to_string().contains("rank 0 did not answer"),
            "{error}"
        );
    }

    #[test]
    fn a_lost_rank_is_an_error_not_a_hang() {
        let results = run_group(2, |group| {
            if group.rank() == 1 {
                drop(group);
                return Ok(Vec::new());
            }
            group.all_gather(&[1]).map_err(|e| e.to_string())
        });
        let error = results[0].clone().unwrap_err();
        assert!(error.starts_with("lost the link to rank 1"), "{error}");
    }
}
