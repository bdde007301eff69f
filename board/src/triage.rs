//! A card in triage specified or decomposed, in one transaction: the
//! children made and linked, the card's fields changed, the card put in
//! line and the note left, or (the card no longer in triage, a child
//! refused) nothing at all.

use kanban_core::rules::Start;
use kanban_core::triage::{self, Settled, Specification, TriagePlan};
use kanban_core::{BoardError, NewTask, events};

use crate::StoredBoard;
use crate::admin::{insert_task, link_cards};
use crate::engine::{Durability, Engine, TxResult};
use crate::statements::Tx;
use crate::worker::{apply, existing_card};

async fn settle_plan(
    tx: &mut Tx<'_>,
    task_id: &str,
    plan: &TriagePlan,
    agent: &str,
    author: &str,
    now: i64,
) -> TxResult<Settled> {
    let Some(root) = tx.task(task_id).await? else {
        return Err(BoardError::TaskNotFound(task_id.to_owned()).into());
    };
    // Refused before anything is made when the card left triage.
    let card = existing_card(tx, task_id).await?;
    let current = Specification {
        title: Some(root.title.clone()),
        body: root.body.clone(),
        assignee: root.assignee.clone(),
    };
    triage::settle(&card, &current, plan, &[], author)?;
    let mut child_ids = Vec::new();
    if let TriagePlan::Decompose { children, .. } = plan {
        let mut ids: Vec<Option<String>> = vec![None; children.len()];
        for index in triage::creation_order(children) {
            let child = &children[index];
            let new = NewTask {
                title: child.title.clone(),
                body: child.body.clone(),
                assignee: child.assignee.clone(),
                priority: root.priority,
                parents: child
                    .parents
                    .iter()
                    .filter_map(|parent| ids[*parent].clone())
                    .collect(),
                start: Start::InLine,
                created_by: Some(author.to_owned()),
                tenant: root.tenant.clone(),
                workspace: child.workspace.clone(),
                ..NewTask::default()
            };
            events::check_new_task(&new)?;
            ids[index] = Some(insert_task(tx, &new, now).await?);
        }
        child_ids = ids.into_iter().flatten().collect();
        for child in &child_ids {
            link_cards(tx, child, task_id, now).await?;
        }
    }
    let card = existing_card(tx, task_id).await?;
    let transition = triage::settle(&card, &current, plan, &child_ids, author)?;
    apply(tx, task_id, &transition, now).await?;
    let status = transition.status.unwrap_or(card.status);
    tx.insert_comment(task_id, author, &triage::note(plan, agent, &child_ids), now)
        .await?;
    tx.append_event(task_id, &events::commented(None, author), now)
        .await?;
    Ok(Settled { child_ids, status })
}

impl<E: Engine> StoredBoard<E> {
    /// Writes the plan an agent answered for a card in triage (core's
    /// [`triage`]): the cards it made, in the plan's order, and where the
    /// card went.
    pub async fn settle_triage(
        &self,
        task_id: &str,
        plan: &TriagePlan,
        agent: &str,
        author: &str,
    ) -> Result<Settled, BoardError> {
        triage::check_plan(plan)?;
        if let Err(problem) = events::check_label(author) {
            return Err(BoardError::InvalidInput(format!("the author {problem}")));
        }
        let (task_id, plan) = (task_id.to_owned(), plan.clone());
        let (agent, author) = (agent.to_owned(), author.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, plan) = (task_id.clone(), plan.clone());
                let (agent, author) = (agent.clone(), author.clone());
                Box::pin(async move {
                    settle_plan(&mut Tx::new(sql), &task_id, &plan, &agent, &author, now).await
                })
            })
            .await
    }
}
