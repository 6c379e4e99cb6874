//! The panics of a run. A simulated broker's core that panics is, to `Server::wait`, a core
//! that failed, and the run went on as after a crash. A release binary (`panic = "abort"`)
//! aborts on the same panic instead: it is a broken invariant of the code under test, and the
//! run reports it rather than surviving it.
//!
//! Both simulations (the brokers' and the Raft one, `raft.rs`) run on one thread, so a
//! thread's record is the run's.

use std::cell::RefCell;
use std::panic;
use std::sync::Once;

thread_local! {
    static SEEN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

static HOOK: Once = Once::new();

/// Records this thread's panics from now on (after whatever the previous hook does), and
/// forgets any recorded before.
pub fn watch() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            SEEN.with(|s| s.borrow_mut().push(info.to_string()));
            previous(info);
        }));
    });
    SEEN.with(|s| s.borrow_mut().clear());
}

/// The panics recorded on this thread since `watch`.
pub fn seen() -> Vec<String> {
    SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
}
