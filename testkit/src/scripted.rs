//! Scripted agents and judges that record what they were given.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kanban_core::{
    Judge, JudgeError, TurnInput, TurnOutcome, TurnResult, TurnRunner, Verdict, VerdictKind,
};

/// A shared, growing list of what a scripted part was given.
#[derive(Clone, Debug)]
pub struct Recorded<T> {
    items: Arc<Mutex<Vec<T>>>,
}

impl<T> Default for Recorded<T> {
    fn default() -> Self {
        Self {
            items: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<T: Clone> Recorded<T> {
    fn push(&self, item: T) {
        self.items.lock().unwrap().push(item);
    }

    /// Everything recorded so far.
    pub fn all(&self) -> Vec<T> {
        self.items.lock().unwrap().clone()
    }

    /// How many items were recorded.
    pub fn len(&self) -> usize {
        self.items.lock().unwrap().len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

type TurnScript = Box<dyn FnMut(&TurnInput) -> TurnOutcome + Send>;

/// An agent that answers each turn from a script and records every input.
pub struct ScriptedRunner {
    script: TurnScript,
    entered: Recorded<TurnInput>,
}

impl std::fmt::Debug for ScriptedRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedRunner")
            .field("entered", &self.entered.len())
            .finish()
    }
}

impl ScriptedRunner {
    /// Answers turn N with the Nth result; `None` is "nothing settled". Past
    /// the end of the list the last entry repeats.
    pub fn results(results: Vec<Option<TurnResult>>) -> Self {
        assert!(
            !results.is_empty(),
            "a scripted runner needs at least one result"
        );
        let mut queue: VecDeque<Option<TurnResult>> = results.into();
        Self::outcomes(move |_| {
            let next = if queue.len() > 1 {
                queue.pop_front()
            } else {
                queue.front().cloned()
            };
            Ok(next.flatten())
        })
    }

    /// Answers every turn with the same result.
    pub fn always(result: TurnResult) -> Self {
        Self::outcomes(move |_| Ok(Some(result.clone())))
    }

    /// Answers each turn with whatever `script` returns for its input.
    pub fn outcomes(script: impl FnMut(&TurnInput) -> TurnOutcome + Send + 'static) -> Self {
        Self {
            script: Box::new(script),
            entered: Recorded::default(),
        }
    }

    /// Every input this runner was entered with, shared with the runner.
    pub fn entered(&self) -> Recorded<TurnInput> {
        self.entered.clone()
    }
}

#[async_trait]
impl TurnRunner for ScriptedRunner {
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome {
        self.entered.push(input.clone());
        (self.script)(input)
    }
}

/// A judge that rules from a list of verdicts (the last repeats) and
/// records each `(goal, last_response)` it was asked about.
#[derive(Debug)]
pub struct ScriptedJudge {
    verdicts: Mutex<VecDeque<Result<Verdict, JudgeError>>>,
    calls: Recorded<(String, String)>,
}

impl ScriptedJudge {
    /// Rules `verdicts` in order.
    pub fn new(verdicts: Vec<VerdictKind>) -> Self {
        let verdicts = verdicts
            .into_iter()
            .map(|verdict| {
                Ok(Verdict {
                    verdict,
                    reason: format!("scripted {verdict:?}"),
                })
            })
            .collect();
        Self {
            verdicts: Mutex::new(verdicts),
            calls: Recorded::default(),
        }
    }

    /// A judge that always fails.
    pub fn failing() -> Self {
        Self {
            verdicts: Mutex::new(VecDeque::from([Err(JudgeError(
                "scripted failure".to_owned(),
            ))])),
            calls: Recorded::default(),
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Recorded<(String, String)> {
        self.calls.clone()
    }
}

#[async_trait]
impl Judge for ScriptedJudge {
    async fn judge(&self, goal: &str, last_response: &str) -> Result<Verdict, JudgeError> {
        self.calls.push((goal.to_owned(), last_response.to_owned()));
        let mut verdicts = self.verdicts.lock().unwrap();
        if verdicts.len() > 1 {
            verdicts.pop_front().unwrap()
        } else {
            verdicts.front().cloned().unwrap()
        }
    }
}
