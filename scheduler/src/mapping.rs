//! Software queues onto hardware queue slots (seed 002, "Oversubscribed Command Queues in
//! GPUs"): when a vGPU's ready queues outnumber the GPU's slots, round-robin mapping with a
//! quantum wastes slots on queues with nothing ready; mapping by priority, with the HEFT
//! upward rank of the guest's task graph (critical path first), does not.
//!
//! A task graph: tasks with a cost, a queue (the guest stream that submits it) and
//! dependencies. `upward_ranks` computes HEFT ranks; `simulate` runs the graph on `slots`
//! hardware slots under a mapping and returns the makespan.

use std::collections::BTreeSet;

use crate::clock::Nanos;

/// One task (a kernel launch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub cost: Nanos,
    /// The software queue (stream) it is submitted on; tasks of a queue run in order.
    pub queue: usize,
    /// Tasks that must finish first (indices into the graph).
    pub deps: Vec<usize>,
}

/// How software queues get hardware slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Slots rotate over all queues, each holding a slot for `quantum` whether or not it
    /// has a ready task.
    RoundRobin { quantum: Nanos },
    /// A free slot goes to the ready task with the highest upward rank.
    Priority,
}

/// Why a graph is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("task {task} depends on task {dep}, which does not exist")]
    MissingDep { task: usize, dep: usize },
    #[error("the task graph has a cycle through task {0}")]
    Cycle(usize),
    #[error("zero hardware slots")]
    NoSlots,
}

/// Topological order (dependencies first), with queue order as implicit dependencies.
fn topo(tasks: &[Task]) -> Result<Vec<usize>, GraphError> {
    let n = tasks.len();
    let preds = predecessors(tasks)?;
    let mut indeg: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut succ = vec![Vec::new(); n];
    for (t, ps) in preds.iter().enumerate() {
        for &p in ps {
            succ[p].push(t);
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&t| indeg[t] == 0).collect();
    let mut out = Vec::with_capacity(n);
    while let Some(t) = ready.pop() {
        out.push(t);
        for &s in &succ[t] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(s);
            }
        }
    }
    if out.len() != n {
        let stuck = (0..n).find(|t| indeg[*t] > 0).unwrap_or(0);
        return Err(GraphError::Cycle(stuck));
    }
    Ok(out)
}

/// Each task's predecessors: its declared deps plus the previous task on its queue.
fn predecessors(tasks: &[Task]) -> Result<Vec<Vec<usize>>, GraphError> {
    let mut last_on_queue = std::collections::BTreeMap::new();
    let mut preds = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        let mut p: Vec<usize> = Vec::new();
        for &d in &t.deps {
            if d >= tasks.len() {
                return Err(GraphError::MissingDep { task: i, dep: d });
            }
            p.push(d);
        }
        if let Some(prev) = last_on_queue.insert(t.queue, i) {
            p.push(prev);
        }
        p.sort_unstable();
        p.dedup();
        preds.push(p);
    }
    Ok(preds)
}

/// HEFT upward rank: a task's cost plus the largest rank among its successors (the length
/// of the longest path from it to the end).
pub fn upward_ranks(tasks: &[Task]) -> Result<Vec<Nanos>, GraphError> {
    let order = topo(tasks)?;
    let preds = predecessors(tasks)?;
    let mut rank = vec![0u64; tasks.len()];
    let mut best_succ = vec![0u64; tasks.len()];
    for &t in order.iter().rev() {
        rank[t] = tasks[t].cost + best_succ[t];
        for &p in &preds[t] {
            best_succ[p] = best_succ[p].max(rank[t]);
        }
    }
    Ok(rank)
}

/// Runs the graph on `slots` hardware slots under `mapping`; returns the makespan.
pub fn simulate(tasks: &[Task], slots: usize, mapping: Mapping) -> Result<Nanos, GraphError> {
    if slots == 0 {
        return Err(GraphError::NoSlots);
    }
    let preds = predecessors(tasks)?;
    let rank = upward_ranks(tasks)?;
    let n = tasks.len();
    let queues: BTreeSet<usize> = tasks.iter().map(|t| t.queue).collect();
    let queues: Vec<usize> = queues.into_iter().collect();
    let mut finish: Vec<Option<Nanos>> = vec![None; n];
    let mut started = vec![false; n];
    // Running tasks: (finish time, task).
    let mut running: Vec<(Nanos, usize)> = Vec::new();
    let mut now: Nanos = 0;
    let mut rr_next = 0usize;
    let mut done = 0;
    let ready_at = |t: usize, finish: &[Option<Nanos>], now: Nanos| {
        preds[t]
            .iter()
            .all(|&p| finish[p].is_some_and(|f| f <= now))
    };
    while done < n {
        // Retire what finished by now.
        running.retain(|&(f, _)| f > now);
        let free = slots - running.len();
        match mapping {
            Mapping::Priority => {
                let mut ready: Vec<usize> = (0..n)
                    .filter(|&t| !started[t] && ready_at(t, &finish, now))
                    .collect();
                ready.sort_by_key(|&t| std::cmp::Reverse(rank[t]));
                for &t in ready.iter().take(free) {
                    started[t] = true;
                    let f = now + tasks[t].cost;
                    finish[t] = Some(f);
                    running.push((f, t));
                }
            }
            Mapping::RoundRobin { quantum } => {
                // The slots hold `slots` consecutive queues for one quantum; only their ready
                // heads may run, the rest of the slots idle.
                let quantum = quantum.max(1);
                let window: Vec<usize> = (0..slots.min(queues.len()))
                    .map(|i| queues[(rr_next + i) % queues.len()])
                    .collect();
                for q in window {
                    if running.len() >= slots {
                        break;
                    }
                    if running.iter().any(|&(_, t)| tasks[t].queue == q) {
                        continue;
                    }
                    let head = (0..n).find(|&t| tasks[t].queue == q && !started[t]);
                    if let Some(t) = head.filter(|&t| ready_at(t, &finish, now)) {
                        started[t] = true;
                        let f = now + tasks[t].cost;
                        finish[t] = Some(f);
                        running.push((f, t));
                    }
                }
                // Advance to the end of the quantum or the next finish, whichever first;
                // rotate at quantum boundaries.
                let next_finish = running
                    .iter()
                    .map(|&(f, _)| f)
                    .min()
                    .unwrap_or(now + quantum);
                let boundary = (now / quantum + 1) * quantum;
                if boundary <= next_finish {
                    rr_next = (rr_next + slots) % queues.len().max(1);
                }
                done = finish
                    .iter()
                    .filter(|f| f.is_some_and(|f| f <= boundary.min(next_finish)))
                    .count();
                now = boundary.min(next_finish);
                continue;
            }
        }
        let next = running.iter().map(|&(f, _)| f).min();
        done = finish
            .iter()
            .filter(|f| f.is_some_and(|f| f <= next.unwrap_or(now)))
            .count();
        match next {
            Some(t) => now = t,
            None if done < n => return Err(GraphError::Cycle(0)),
            None => {}
        }
    }
    Ok(finish.iter().flatten().copied().max().unwrap_or(0))
}

/// An NW-like wavefront: an `n`×`n` grid of tasks, each depending on its top and left
/// neighbours, anti-diagonals spread over `queues` software queues.
pub fn wavefront(n: usize, queues: usize, cost: Nanos) -> Vec<Task> {
    let idx = |i: usize, j: usize| i * n + j;
    let mut tasks = Vec::with_capacity(n * n);
    for i in 0..n {
        for j in 0..n {
            let mut deps = Vec::new();
            if i > 0 {
                deps.push(idx(i - 1, j));
            }
            if j > 0 {
                deps.push(idx(i, j - 1));
            }
            tasks.push(Task {
                cost,
                queue: (i + j) % queues.max(1),
                deps,
            });
        }
    }
    // Queue order must respect dependencies: order tasks by anti-diagonal.
    let mut order: Vec<usize> = (0..n * n).collect();
    order.sort_by_key(|&t| (t / n + t % n, t));
    let pos: Vec<usize> = {
        let mut p = vec![0; n * n];
        for (k, &t) in order.iter().enumerate() {
            p[t] = k;
        }
        p
    };
    order
        .iter()
        .map(|&t| {
            let mut task = tasks[t].clone();
            task.deps = task.deps.iter().map(|&d| pos[d]).collect();
            task
        })
        .collect()
}

/// A random layered DAG of `n` tasks over `queues` queues (deterministic for a seed).
pub fn random_dag(n: usize, queues: usize, seed: u64) -> Vec<Task> {
    let mut s = seed | 1;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|i| {
            let deps = if i == 0 {
                Vec::new()
            } else {
                (0..rnd() % 3).map(|_| (rnd() as usize) % i).collect()
            };
            Task {
                cost: 50_000 + rnd() % 950_000,
                queue: (rnd() as usize) % queues.max(1),
                deps,
            }
        })
        .collect()
}
