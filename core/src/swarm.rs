//! A swarm: parallel worker cards, a verifier card that waits for all of
//! them, and a synthesizer card that waits for the verifier, under a root
//! card that is done at once and keeps the swarm's shared notes.
//!
//! The graph is the seed system's `kanban swarm` graph, with its titles,
//! its root metadata and its topology note on the root (a comment starting
//! with [`BLACKBOARD_PREFIX`]), so either system finds a swarm the other
//! made, and a repeated idempotency key returns the first swarm's cards
//! instead of making a second. A board makes the whole graph in one
//! transaction (the seed system makes it card by card).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{BoardError, Handoff, NewTask};

/// The start of a structured note on a swarm's root card.
pub const BLACKBOARD_PREFIX: &str = "[swarm:blackboard] ";
/// The root's completion metadata `kind`.
pub const SWARM_KIND: &str = "kanban_swarm_v1";
/// The most worker cards one swarm makes.
pub const MAX_SWARM_WORKERS: usize = 64;

/// One parallel worker card: its assignee and title (also its body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwarmWorker {
    pub assignee: String,
    pub title: String,
}

impl SwarmWorker {
    /// `ASSIGNEE:TITLE`, as `--worker` takes it. The seed system's third
    /// part (skills) is refused: cards here keep no skills.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut parts = raw.splitn(3, ':').map(str::trim);
        let (Some(assignee), Some(title)) = (parts.next(), parts.next()) else {
            return Err(format!(
                "--worker {raw:?} is not ASSIGNEE:TITLE (for example writer:draft the notes)"
            ));
        };
        if let Some(skills) = parts.next().filter(|skills| !skills.is_empty()) {
            return Err(format!(
                "--worker {raw:?} names skills ({skills}), which cards here do not keep; give ASSIGNEE:TITLE"
            ));
        }
        if assignee.is_empty() || title.is_empty() {
            return Err(format!(
                "--worker {raw:?} needs both an assignee and a title: ASSIGNEE:TITLE"
            ));
        }
        Ok(Self {
            assignee: assignee.to_owned(),
            title: title.to_owned(),
        })
    }
}

/// A swarm to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swarm {
    pub goal: String,
    pub workers: Vec<SwarmWorker>,
    pub verifier: String,
    pub synthesizer: String,
    /// The maker, named on every card; the root is assigned to it.
    pub created_by: String,
    pub priority: i64,
    /// Kept on the root: a second swarm with the same key is the first.
    pub idempotency_key: Option<String>,
}

/// The cards of one swarm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwarmCards {
    pub root_id: String,
    pub worker_ids: Vec<String>,
    pub verifier_id: String,
    pub synthesizer_id: String,
}

/// What a board did with a swarm: its cards, and whether it made them now
/// (false when an earlier swarm had the same idempotency key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swarmed {
    pub cards: SwarmCards,
    pub made: bool,
}

impl Swarm {
    /// What a board refuses before it opens a transaction.
    pub fn check(&self) -> Result<(), BoardError> {
        let refuse = |why: String| Err(BoardError::InvalidInput(why));
        if self.goal.trim().is_empty() {
            return refuse("a swarm needs a non-blank goal".to_owned());
        }
        if self.workers.is_empty() {
            return refuse("a swarm needs at least one --worker ASSIGNEE:TITLE".to_owned());
        }
        if self.workers.len() > MAX_SWARM_WORKERS {
            return refuse(format!(
                "a swarm has at most {MAX_SWARM_WORKERS} workers ({} given); split the goal",
                self.workers.len()
            ));
        }
        for (name, value) in [
            ("--verifier", &self.verifier),
            ("--synthesizer", &self.synthesizer),
            ("--created-by", &self.created_by),
        ] {
            if value.trim().is_empty() {
                return refuse(format!("a swarm needs a non-blank {name}"));
            }
        }
        if let Some(worker) = self
            .workers
            .iter()
            .find(|w| w.assignee.trim().is_empty() || w.title.trim().is_empty())
        {
            return refuse(format!(
                "every swarm worker needs an assignee and a title ({worker:?} has not)"
            ));
        }
        Ok(())
    }

    /// The root card: assigned to the maker, done at once with
    /// [`Swarm::root_handoff`], the swarm's shared notes.
    pub fn root(&self) -> NewTask {
        let headline: String = self
            .goal
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(80)
            .collect();
        NewTask {
            title: format!("Swarm: {headline}"),
            body: Some(format!(
                "The root of a swarm, done as soon as it is made so its workers can start; it stays as the swarm's shared notes and its record.\n\nGoal:\n{}",
                self.goal
            )),
            assignee: Some(self.created_by.clone()),
            created_by: Some(self.created_by.clone()),
            priority: self.priority,
            idempotency_key: self.idempotency_key.clone(),
            ..NewTask::default()
        }
    }

    /// How the root is done: the seed system's summary and metadata.
    pub fn root_handoff(&self) -> Handoff {
        let metadata = json!({
            "kind": SWARM_KIND,
            "goal": self.goal,
            "worker_count": self.workers.len(),
        });
        Handoff {
            metadata: metadata.as_object().cloned(),
            ..Handoff::new(
                "Swarm topology planned; root remains the shared blackboard.",
                None,
            )
        }
    }

    /// The notes every card of the swarm ends with.
    fn protocol(&self, root: &str) -> String {
        format!(
            "\n\n## Swarm protocol\n- The swarm's root and shared notes: `{root}`.\n- Read the handoffs of the cards you wait for before you start.\n- Put facts a machine reads in your completion's metadata.\n- Leave notes for the other workers as comments on the root.\n- Goal: {}\n",
            self.goal.trim()
        )
    }

    fn card(&self, title: &str, assignee: &str, body: String, parents: Vec<String>) -> NewTask {
        NewTask {
            title: title.to_owned(),
            body: Some(body),
            assignee: Some(assignee.to_owned()),
            created_by: Some(self.created_by.clone()),
            priority: self.priority,
            parents,
            ..NewTask::default()
        }
    }

    /// The parallel worker cards, each waiting for the (done) root.
    pub fn worker_cards(&self, root: &str) -> Vec<NewTask> {
        self.workers
            .iter()
            .map(|worker| {
                let body = format!("{}{}", worker.title, self.protocol(root));
                self.card(&worker.title, &worker.assignee, body, vec![root.to_owned()])
            })
            .collect()
    }

    /// The verifier, waiting for every worker card.
    pub fn verifier_card(&self, root: &str, worker_ids: &[String]) -> NewTask {
        let body = format!(
            "Review every worker's handoff and the notes on the root, then gate the swarm: complete with metadata {{\"gate\": \"pass\"}} only when the evidence is enough; otherwise block, naming the work that is missing.{}",
            self.protocol(root)
        );
        self.card(
            "Verify swarm outputs",
            &self.verifier,
            body,
            worker_ids.to_vec(),
        )
    }

    /// The synthesizer, waiting for the verifier.
    pub fn synthesizer_card(&self, root: &str, verifier_id: &str) -> NewTask {
        let body = format!(
            "Turn the verified worker outputs into the final deliverable; start only once the verifier has passed the gate.{}",
            self.protocol(root)
        );
        self.card(
            "Synthesize swarm outputs",
            &self.synthesizer,
            body,
            vec![verifier_id.to_owned()],
        )
    }

    /// The topology note on the root, as the seed system writes it.
    pub fn topology_note(&self, cards: &SwarmCards) -> String {
        let mut value = serde_json::to_value(cards).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("goal".into(), json!(self.goal));
        }
        format!(
            "{BLACKBOARD_PREFIX}{}",
            json!({"key": "topology", "value": value})
        )
    }
}

/// The swarm a root's notes record: the newest note whose key is
/// `topology` (a later note replaces an earlier one, as in the seed
/// system), when it names every card; `None` otherwise.
pub fn recorded_topology<'a>(
    notes_newest_first: impl IntoIterator<Item = &'a str>,
) -> Option<SwarmCards> {
    let value = notes_newest_first.into_iter().find_map(|note| {
        let payload: Value = serde_json::from_str(note.strip_prefix(BLACKBOARD_PREFIX)?).ok()?;
        (payload.get("key")? == "topology").then(|| payload.get("value").cloned())?
    })?;
    let cards: SwarmCards = serde_json::from_value(value).ok()?;
    let named = |id: &String| !id.is_empty();
    (!cards.worker_ids.is_empty()
        && cards.worker_ids.iter().all(named)
        && named(&cards.root_id)
        && named(&cards.verifier_id)
        && named(&cards.synthesizer_id))
    .then_some(cards)
}
