//! The device lock as a verb takes it: exclusive access to the engine, and
//! on release the pass that sends what the verb made sendable.

use super::pacing::Verb;
use super::shared::{Core, Shared};
use crate::engine::Engine;
use parking_lot::MutexGuard;

/// Exclusive access to the device's engine; on drop, whatever the caller
/// made sendable is sent and completion channels are signalled.
///
/// The lock is released fairly (handed to a waiting thread, if any): a
/// program spinning on `poll_cq` would otherwise re-take it at once and
/// starve the progress thread until parking_lot's forced fairness, about
/// half a millisecond later.
pub struct EngineGuard<'a> {
    pub(super) core: Option<MutexGuard<'a, Core>>,
    pub(super) shared: &'a Shared,
    /// What the guard was taken for: it decides the pass's pacing
    /// (`Pacer::verb_pass`).
    pub(super) verb: Verb,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        match &self.core {
            Some(c) => &c.engine,
            None => unreachable!("the guard is only emptied in drop"),
        }
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        match &mut self.core {
            Some(c) => &mut c.engine,
            None => unreachable!("the guard is only emptied in drop"),
        }
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        let Some(mut core) = self.core.take() else {
            return;
        };
        let pacer = &self.shared.pacer;
        let ack_clocked = pacer.verb_pass(self.verb, || core.engine.load());
        let batch = self.shared.after_work(&mut core, ack_clocked);
        pacer.verb_done(self.verb, || core.engine.load());
        MutexGuard::unlock_fair(core);
        self.shared.send_batch(batch);
    }
}
