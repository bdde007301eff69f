//! Moving a card from one lane to another by hand (the web board's drag
//! and drop and its keys): which operator operation a move is, or why the
//! board refuses it. Each operation is then checked by its own rule in
//! [`crate::rules`]; this table only names it, so a move can never do
//! what the same operation on the command line could not.

use crate::TaskStatus;

/// The operator operation a move between lanes stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveOperation {
    /// Back in line now (`kanban unblock`).
    Unblock,
    /// Out of triage or todo into ready (`kanban promote`).
    Promote,
    /// A running card's claim taken back (`kanban reclaim`): its worker is
    /// fenced out and stopped.
    Reclaim,
    /// Parked until released (`kanban hold`).
    Hold,
    /// Back to a person (`kanban triage`).
    Triage,
    /// Up for review (`kanban review`).
    Review,
}

impl MoveOperation {
    /// The operation's name: the web board's action and the CLI's command.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unblock => "unblock",
            Self::Promote => "promote",
            Self::Reclaim => "reclaim",
            Self::Hold => "hold",
            Self::Triage => "triage",
            Self::Review => "review",
        }
    }
}

/// The operation that moves a card from the lane `from` to the lane `to`,
/// or why no operator may make that move (in words a person can act on).
pub fn operation(from: TaskStatus, to: TaskStatus) -> Result<MoveOperation, String> {
    use TaskStatus as S;
    if from == to {
        return Err(format!("the card is already {}", to.as_str()));
    }
    match (from, to) {
        (S::Archived, _) => Err("an archived card stays archived".to_owned()),
        (_, S::Running) => {
            Err("a card runs only when a dispatcher claims it; move it to ready".to_owned())
        }
        (_, S::Blocked) => Err(
            "only its agent blocks a card; to keep it from being claimed, move it to scheduled (a hold)"
                .to_owned(),
        ),
        (_, S::Done) => Err("a card is done when its agent completes it".to_owned()),
        (_, S::Archived) => Err("archive or cancel a card with its action, not a move".to_owned()),
        (S::Running, S::Ready | S::Todo) => Ok(MoveOperation::Reclaim),
        (S::Running, _) => Err(
            "a running card goes back in line first (move it to ready), or is cancelled".to_owned(),
        ),
        (S::Blocked | S::Scheduled, S::Ready | S::Todo) => Ok(MoveOperation::Unblock),
        (S::Triage, S::Ready | S::Todo) | (S::Todo, S::Ready) => Ok(MoveOperation::Promote),
        (S::Ready, S::Todo) => Err(
            "a card waits in todo only for its parents; link a parent to it to make it wait"
                .to_owned(),
        ),
        (S::Ready | S::Todo, S::Scheduled) => Ok(MoveOperation::Hold),
        (S::Todo | S::Ready | S::Scheduled | S::Blocked, S::Triage) => Ok(MoveOperation::Triage),
        (S::Todo | S::Ready | S::Scheduled | S::Blocked | S::Done, S::Review) => {
            Ok(MoveOperation::Review)
        }
        (S::Done, _) => Err(
            "a done card stays done; move it to review to have its work checked again".to_owned(),
        ),
        (S::Review, _) => Err(
            "a card in review waits for its reviewer's run; cancel it to take it off the board"
                .to_owned(),
        ),
        (S::Triage, S::Scheduled) => Err(
            "a card in triage is never claimed anyway; promote it first to hold it".to_owned(),
        ),
        (S::Blocked, S::Scheduled) => Err(
            "a blocked card is never claimed anyway; unblock it (move it to ready) first".to_owned(),
        ),
        (S::Triage, S::Review) => Err(
            "a card in triage is shaped first: promote it, then move it to review".to_owned(),
        ),
        _ => Err(format!(
            "no move from {} to {}",
            from.as_str(),
            to.as_str()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{self, CardState};
    use TaskStatus as S;

    fn card(status: TaskStatus) -> CardState {
        CardState {
            task_id: "t_1".to_owned(),
            status,
            current_run_id: (status == S::Running).then_some(7),
            claim_lock: (status == S::Running).then(|| "lock".to_owned()),
            claim_expires: (status == S::Running).then_some(1_000),
            worker_pid: None,
            consecutive_failures: 0,
            max_retries: None,
            open_parents: false,
            held: false,
            not_before: None,
            block_kind: None,
            block_recurrences: 0,
        }
    }

    /// What the operation's own rule does to a card in `from`: the status
    /// it lands in, or its refusal.
    fn apply(operation: MoveOperation, from: TaskStatus) -> Result<TaskStatus, String> {
        let card = card(from);
        let transition = match operation {
            MoveOperation::Unblock => rules::unblock(&card),
            MoveOperation::Promote => rules::promote_by_hand(&card, None, false),
            MoveOperation::Reclaim => rules::reclaim(&card, "moved", 0),
            MoveOperation::Hold => rules::hold(&card, "moved"),
            MoveOperation::Triage => rules::to_triage(&card, None),
            MoveOperation::Review => rules::to_review(&card, None),
        }
        .map_err(|error| error.to_string())?;
        Ok(transition.status.unwrap_or(from))
    }

    /// Every move the table allows is one its operation's rule accepts, and
    /// it lands where it was dropped (ready when dropped on todo: a card
    /// with no open parent is ready).
    #[test]
    fn every_allowed_move_is_accepted_by_its_rule_and_lands_where_dropped() {
        let mut allowed = 0;
        for from in TaskStatus::ALL {
            for to in TaskStatus::ALL {
                let Ok(operation) = operation(from, to) else {
                    continue;
                };
                allowed += 1;
                let landed = apply(operation, from)
                    .unwrap_or_else(|why| panic!("{from:?} -> {to:?} by {operation:?}: {why}"));
                let expected = if to == S::Todo { S::Ready } else { to };
                assert_eq!(landed, expected, "{from:?} -> {to:?} by {operation:?}");
            }
        }
        assert_eq!(allowed, 20);
    }

    #[test]
    fn the_table_names_each_move() {
        let cases = [
            (S::Blocked, S::Ready, Ok(MoveOperation::Unblock)),
            (S::Scheduled, S::Todo, Ok(MoveOperation::Unblock)),
            (S::Triage, S::Ready, Ok(MoveOperation::Promote)),
            (S::Triage, S::Todo, Ok(MoveOperation::Promote)),
            (S::Todo, S::Ready, Ok(MoveOperation::Promote)),
            (S::Running, S::Ready, Ok(MoveOperation::Reclaim)),
            (S::Running, S::Todo, Ok(MoveOperation::Reclaim)),
            (S::Ready, S::Scheduled, Ok(MoveOperation::Hold)),
            (S::Todo, S::Scheduled, Ok(MoveOperation::Hold)),
            (S::Blocked, S::Triage, Ok(MoveOperation::Triage)),
            (S::Scheduled, S::Triage, Ok(MoveOperation::Triage)),
            (S::Scheduled, S::Review, Ok(MoveOperation::Review)),
            (S::Done, S::Review, Ok(MoveOperation::Review)),
            (S::Ready, S::Review, Ok(MoveOperation::Review)),
            (S::Ready, S::Ready, Err("already ready")),
            (S::Ready, S::Running, Err("dispatcher claims")),
            (S::Ready, S::Blocked, Err("only its agent blocks")),
            (S::Running, S::Done, Err("agent completes")),
            (S::Ready, S::Archived, Err("with its action")),
            (S::Archived, S::Ready, Err("stays archived")),
            (S::Running, S::Triage, Err("back in line first")),
            (S::Ready, S::Todo, Err("link a parent")),
            (S::Done, S::Ready, Err("stays done")),
            (S::Review, S::Ready, Err("reviewer")),
            (S::Triage, S::Scheduled, Err("promote it first")),
            (S::Blocked, S::Scheduled, Err("unblock it")),
            (S::Triage, S::Review, Err("shaped first")),
            (S::Triage, S::Triage, Err("already triage")),
        ];
        for (from, to, expected) in cases {
            match (operation(from, to), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{from:?} -> {to:?}"),
                (Err(why), Err(words)) => {
                    assert!(why.contains(words), "{from:?} -> {to:?}: {why}");
                }
                (got, want) => panic!("{from:?} -> {to:?}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn each_operation_has_its_command_name() {
        let names: Vec<&str> = [
            MoveOperation::Unblock,
            MoveOperation::Promote,
            MoveOperation::Reclaim,
            MoveOperation::Hold,
            MoveOperation::Triage,
            MoveOperation::Review,
        ]
        .into_iter()
        .map(MoveOperation::as_str)
        .collect();
        assert_eq!(
            names,
            ["unblock", "promote", "reclaim", "hold", "triage", "review"]
        );
    }
}
