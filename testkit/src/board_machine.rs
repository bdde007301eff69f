//! The board as a state machine: random sequences of create, claim,
//! heartbeat, complete, block, unblock, advance time, release stale claims
//! and stale writers, checked against a model after every step. The same
//! machine runs on every engine: a board's tests name a [`FreshBoard`] and
//! run [`BoardMachine`] with `prop_state_machine!`.

use std::marker::PhantomData;

use crate::{VirtualClock, block_on};
use kanban_core::rules::{FailurePolicy, Release};
use kanban_core::{Board, BoardAdmin, BoardError, Claim, DispatchBoard, NewTask, TaskStatus};
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

const TTL: i64 = 300;
/// Stale releases that block a card.
const FAILURE_LIMIT: u32 = 2;

#[derive(Clone, Debug)]
pub struct ModelTask {
    status: TaskStatus,
    /// Counted failures: stale releases, reset by a completion or an unblock.
    failures: u32,
    /// The run id holding the card and its lease expiry, while running.
    run: Option<(i64, i64)>,
    /// Blocks in a row (all untyped, so all of one kind) since it was last
    /// done: at the seed system's limit a block sends it to triage.
    blocks: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    now: i64,
    tasks: Vec<ModelTask>,
    /// Every claim ever granted: (task index, run id). Run ids count claims.
    tokens: Vec<(usize, i64)>,
    rejected_writes: usize,
}

impl Model {
    fn live(&self, token: usize) -> bool {
        let (task, run_id) = self.tokens[token];
        matches!(self.tasks[task].run, Some((run, expires)) if run == run_id && expires >= self.now)
            && self.tasks[task].status == TaskStatus::Running
    }
}

#[derive(Clone, Debug)]
pub enum Step {
    Create,
    Claim(usize),
    Heartbeat(usize),
    Complete(usize),
    Block(usize),
    Unblock(usize),
    Advance(i64),
    ReleaseStale,
}

#[derive(Debug)]
pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model {
            now: 10_000,
            ..Model::default()
        })
        .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let tasks = state.tasks.len().max(1);
        let tokens = state.tokens.len().max(1);
        prop_oneof![
            2 => Just(Step::Create),
            4 => (0..tasks).prop_map(Step::Claim),
            2 => (0..tokens).prop_map(Step::Heartbeat),
            3 => (0..tokens).prop_map(Step::Complete),
            1 => (0..tokens).prop_map(Step::Block),
            1 => (0..tasks).prop_map(Step::Unblock),
            2 => (1..2 * TTL).prop_map(Step::Advance),
            1 => Just(Step::ReleaseStale),
        ]
        .boxed()
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        match step {
            Step::Claim(t) | Step::Unblock(t) => *t < state.tasks.len(),
            Step::Heartbeat(k) | Step::Complete(k) | Step::Block(k) => *k < state.tokens.len(),
            Step::Create | Step::Advance(_) | Step::ReleaseStale => true,
        }
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        match *step {
            Step::Create => state.tasks.push(ModelTask {
                status: TaskStatus::Ready,
                failures: 0,
                run: None,
                blocks: 0,
            }),
            Step::Claim(t) => {
                if state.tasks[t].status == TaskStatus::Ready {
                    let run_id = state.tokens.len() as i64 + 1;
                    state.tasks[t].status = TaskStatus::Running;
                    state.tasks[t].run = Some((run_id, state.now + TTL));
                    state.tokens.push((t, run_id));
                }
            }
            Step::Heartbeat(k) => {
                if state.live(k) {
                    let (t, run_id) = state.tokens[k];
                    state.tasks[t].run = Some((run_id, state.now + TTL));
                } else {
                    state.rejected_writes += 1;
                }
            }
            Step::Complete(k) | Step::Block(k) => {
                if state.live(k) {
                    let done = matches!(step, Step::Complete(_));
                    let task = &mut state.tasks[state.tokens[k].0];
                    task.blocks = if done { 0 } else { task.blocks + 1 };
                    task.status = if done {
                        TaskStatus::Done
                    } else if task.blocks >= kanban_core::rules::BLOCK_RECURRENCE_LIMIT {
                        TaskStatus::Triage
                    } else {
                        TaskStatus::Blocked
                    };
                    task.run = None;
                    if done {
                        task.failures = 0;
                    }
                } else {
                    state.rejected_writes += 1;
                }
            }
            Step::Unblock(t) => {
                if state.tasks[t].status == TaskStatus::Blocked {
                    state.tasks[t].status = TaskStatus::Ready;
                    state.tasks[t].failures = 0;
                }
            }
            Step::Advance(seconds) => state.now += seconds,
            Step::ReleaseStale => {
                let now = state.now;
                for task in &mut state.tasks {
                    if task.status == TaskStatus::Running
                        && task.run.is_some_and(|(_, expires)| expires < now)
                    {
                        task.failures += 1;
                        task.status = if task.failures >= FAILURE_LIMIT {
                            TaskStatus::Blocked
                        } else {
                            TaskStatus::Ready
                        };
                        task.run = None;
                    }
                }
            }
        }
        state
    }
}

/// Where the machine's board lives: each case gets a fresh one.
pub trait FreshBoard {
    /// The board the machine drives.
    type Board: Board + BoardAdmin + DispatchBoard + ?Sized;
    /// What holds it (and its folder or database) for the case.
    type Held: std::ops::Deref<Target = Self::Board>;
    /// A fresh, empty board reading time from `time`.
    fn fresh(time: &VirtualClock) -> Self::Held;
}

/// The board under test and what the machine knows of it.
pub struct Sut<B: FreshBoard> {
    board: B::Held,
    time: VirtualClock,
    ids: Vec<String>,
    claims: Vec<Claim>,
    _kind: PhantomData<B>,
}

impl<B: FreshBoard> std::fmt::Debug for Sut<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sut")
            .field("cards", &self.ids.len())
            .field("claims", &self.claims.len())
            .finish_non_exhaustive()
    }
}

/// The machine on the boards `B` makes.
#[derive(Debug)]
pub struct BoardMachine<B>(PhantomData<B>);

impl<B: FreshBoard> StateMachineTest for BoardMachine<B> {
    type SystemUnderTest = Sut<B>;
    type Reference = Reference;

    fn init_test(model: &Model) -> Sut<B> {
        let time = VirtualClock::at(model.now);
        Sut {
            board: B::fresh(&time),
            time,
            ids: Vec::new(),
            claims: Vec::new(),
            _kind: PhantomData,
        }
    }

    fn apply(mut sut: Sut<B>, model: &Model, step: Step) -> Sut<B> {
        // `model` is the state AFTER the step; liveness before the step is
        // recomputed from the SUT's own knowledge where needed.
        match step {
            Step::Create => {
                let id = block_on(sut.board.create_task(&NewTask {
                    title: format!("card {}", sut.ids.len()),
                    ..NewTask::default()
                }))
                .unwrap();
                sut.ids.push(id);
            }
            Step::Claim(t) => {
                let grant = block_on(sut.board.claim_task(
                    &sut.ids[t],
                    TTL,
                    &format!("w{}", sut.claims.len()),
                ))
                .unwrap();
                match grant {
                    Some(grant) => {
                        assert_eq!(
                            model.tokens.len(),
                            sut.claims.len() + 1,
                            "a claim was granted the model refused"
                        );
                        if let Some(last) = sut.claims.last() {
                            assert!(
                                grant.claim.run_id > last.run_id,
                                "run ids strictly increase"
                            );
                        }
                        sut.claims.push(grant.claim);
                    }
                    None => assert_eq!(
                        model.tokens.len(),
                        sut.claims.len(),
                        "the model granted a claim the board refused"
                    ),
                }
            }
            Step::Heartbeat(k) | Step::Complete(k) | Step::Block(k) => {
                let rejected_before = block_on(stale_events(&sut));
                let claim = &sut.claims[k];
                let result = match step {
                    Step::Heartbeat(_) => block_on(sut.board.heartbeat(claim, None)).map(|_| ()),
                    Step::Complete(_) => block_on(sut.board.complete(claim, "done", None)),
                    _ => block_on(sut.board.block(claim, "stuck", None)),
                };
                if let Err(error) = &result {
                    assert!(
                        matches!(error, BoardError::LeaseLost { .. }),
                        "{step:?}: {error:?}"
                    );
                }
                assert_eq!(
                    rejected_before + usize::from(result.is_err()),
                    model.rejected_writes,
                    "{step:?}: refused exactly when the model refuses"
                );
            }
            Step::Unblock(t) => {
                let _ = block_on(sut.board.unblock(&sut.ids[t]));
            }
            Step::Advance(seconds) => sut.time.advance(seconds),
            Step::ReleaseStale => {
                let policy = FailurePolicy {
                    failure_limit: FAILURE_LIMIT,
                    ..FailurePolicy::default()
                };
                for claim in &sut.claims {
                    block_on(sut.board.release_claim(claim, &Release::Expired, &policy)).unwrap();
                }
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut<B>, model: &Model) {
        let tasks = block_on(sut.board.list_tasks(None)).unwrap();
        assert_eq!(
            tasks.len(),
            model.tasks.len(),
            "nothing lost, nothing extra"
        );
        for (index, id) in sut.ids.iter().enumerate() {
            let view = block_on(sut.board.show_task(id)).unwrap();
            let open: Vec<_> = view
                .runs
                .iter()
                .filter(|run| run.ended_at.is_none())
                .collect();
            assert!(open.len() <= 1, "{id}: at most one open run");
            assert_eq!(
                view.task.current_run_id,
                open.first().map(|run| run.id),
                "{id}: current_run_id is NULL exactly when no run is open"
            );
            assert_eq!(view.task.status, model.tasks[index].status, "{id}: status");
            assert_eq!(
                view.task.consecutive_failures, model.tasks[index].failures,
                "{id}: failures"
            );
            assert_eq!(
                view.task.current_run_id,
                model.tasks[index].run.map(|(run, _)| run),
                "{id}: run"
            );
            assert!(view.runs.windows(2).all(|pair| pair[0].id < pair[1].id));
        }
        assert_eq!(
            block_on(stale_events(sut)),
            model.rejected_writes,
            "every refused write left its event"
        );
    }
}

async fn stale_events<B: FreshBoard>(sut: &Sut<B>) -> usize {
    let mut count = 0;
    for id in &sut.ids {
        count += sut
            .board
            .show_task(id)
            .await
            .unwrap()
            .events
            .iter()
            .filter(|e| e.kind == "stale_write_rejected")
            .count();
    }
    count
}
