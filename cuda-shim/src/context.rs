//! The per-thread context stack (CUDA's "current context").

use std::cell::RefCell;

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

// A thread whose locals are being destroyed (a program's exit handlers calling in) has
// an empty stack: no current context.

/// The current context of this thread.
pub fn current() -> Option<u64> {
    STACK
        .try_with(|s| s.borrow().last().copied())
        .ok()
        .flatten()
}

pub fn push(ctx: u64) {
    let _ = STACK.try_with(|s| s.borrow_mut().push(ctx));
}

pub fn pop() -> Option<u64> {
    STACK.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// Replaces the top of the stack (pushes onto an empty one); `None` pops it.
pub fn set(ctx: Option<u64>) {
    let _ = STACK.try_with(|s| {
        let mut s = s.borrow_mut();
        match ctx {
            Some(c) => match s.last_mut() {
                Some(top) => *top = c,
                None => s.push(c),
            },
            None => {
                s.pop();
            }
        }
    });
}

/// Removes a destroyed context from this thread's stack.
pub fn forget(ctx: u64) {
    let _ = STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx));
}
