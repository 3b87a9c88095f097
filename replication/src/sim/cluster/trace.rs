//! What a run leaves to read: the last lines of its trace, the failure with its seed and
//! tick, a frame described in a line, and the check that a non-voter never votes.

use std::collections::VecDeque;

use crate::vsr::Action;
use crate::wire::{decode, Frame, Limits, Message};

/// The last lines of a run's trace (when traced), each stamped with its tick.
#[derive(Clone, Debug, Default)]
pub(in crate::sim) struct Trace {
    lines: VecDeque<String>,
}

impl Trace {
    /// Keeps `line()` at `now` when `on`, dropping the oldest past `max` lines.
    pub(in crate::sim) fn push(
        &mut self,
        on: bool,
        max: usize,
        now: u64,
        line: impl FnOnce() -> String,
    ) {
        if on {
            if self.lines.len() >= max {
                self.lines.pop_front();
            }
            self.lines.push_back(format!("{now:>7} {}", line()));
        }
    }

    /// The failure of a run with `seed` at tick `now`, with the lines kept.
    pub(in crate::sim) fn failure(&self, seed: u64, now: u64, reason: String) -> Failure {
        Failure {
            seed,
            tick: now,
            reason,
            trace: self.lines.iter().cloned().collect(),
        }
    }
}

/// A failed run: the seed, what broke, and the last lines of trace (when traced).
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub tick: u64,
    pub reason: String,
    pub trace: Vec<String>,
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "seed {} failed at tick {}: {}",
            self.seed, self.tick, self.reason
        )
    }
}

/// A replica that may not vote sends no vote: no PrepareOk, StartViewChange,
/// DoViewChange or StartView, and no client reply (it is never primary).
pub(in crate::sim) fn check_non_voter(r: u8, actions: &[Action]) -> Result<(), String> {
    use crate::wire::Command;
    for action in actions {
        let frame = match action {
            Action::Send { frame, .. } | Action::Broadcast { frame } => frame,
            Action::Reply { .. } => {
                return Err(format!("r{r} replied to a client while it may not vote"))
            }
            _ => continue,
        };
        let command = frame.header().command;
        let vote = [
            Command::PrepareOk,
            Command::StartViewChange,
            Command::DoViewChange,
            Command::StartView,
        ]
        .iter()
        .any(|c| *c as u8 == command);
        if vote {
            return Err(format!(
                "r{r} sent {} while it may not vote",
                describe(frame)
            ));
        }
    }
    Ok(())
}

/// A short description of a frame for the trace.
pub(in crate::sim) fn describe(frame: &Frame) -> String {
    let limits = Limits::default();
    match decode(frame.as_bytes(), &limits) {
        Ok(Message::Prepare(h, _)) => format!("Prepare v{} op{} c{}", h.frame.view, h.op, h.commit),
        Ok(Message::RepairPrepare(h, _)) => format!("RepairPrepare op{}", h.op),
        Ok(Message::PrepareOk(h)) => format!("PrepareOk v{} op{}", h.frame.view, h.op),
        Ok(Message::Commit(h)) => format!("Commit v{} c{}", h.frame.view, h.commit),
        Ok(Message::StartViewChange(h)) => format!("SVC v{}", h.frame.view),
        Ok(Message::DoViewChange(h, s)) => format!(
            "DVC v{} lv{} op{} c{} n{} nack{:b} present{:b}",
            h.frame.view,
            h.log_view,
            h.op,
            h.commit,
            s.len(),
            h.nack_bitset,
            h.present_bitset
        ),
        Ok(Message::StartView(h, s)) => format!(
            "SV v{} op{} c{} n{} inc{}",
            h.frame.view,
            h.op,
            h.commit,
            s.len(),
            h.incarnation != 0
        ),
        Ok(Message::RequestStartView(h)) => format!("RSV v{}", h.frame.view),
        Ok(Message::RequestPrepares(h)) => format!("RequestPrepares {}..={}", h.from_op, h.to_op),
        Ok(Message::RepairDone(h)) => format!("RepairDone {}", h.op),
        Ok(Message::RangeEvicted(h)) => format!("RangeEvicted {}", h.op),
        Ok(m) => format!("{:?}", m.command()),
        Err(e) => format!("invalid frame: {e:?}"),
    }
}
