//! A tracing layer that demotes the one ERROR fuser logs that is no error (see
//! [`DroppedReplies`]).

/// Demotes fuser's one ERROR that is no error: "Failed to send FUSE reply: No such file or
/// directory (os error 2)". The kernel answers ENOENT to a reply whose request it no longer
/// waits for: its caller was interrupted (a signal to a `cat` of a slow file, `timeout -s
/// INT`) and the kernel dropped the request after sending INTERRUPT. Nothing was lost, so
/// the line goes out at DEBUG (target `fuser::reply`); every other failure to send a reply
/// (and everything else fuser logs) keeps its level.
pub struct DroppedReplies;

/// fuser's message for a reply the kernel refused (fuser 0.18, `reply.rs`).
const REPLY_FAILED: &str = "Failed to send FUSE reply: ";

/// Whether an event is fuser's failure to send a reply with ENOENT (see [`DroppedReplies`]).
fn is_dropped_reply(level: tracing::Level, target: &str, message: &str) -> bool {
    level == tracing::Level::ERROR
        && target == "fuser::reply"
        && message.starts_with(REPLY_FAILED)
        && message.ends_with(&format!("(os error {})", libc::ENOENT))
}

/// The message and the `log` crate's target of an event (fuser logs through `log`; the
/// bridge carries the record's target in the `log.target` field).
#[derive(Default)]
struct MessageAndTarget {
    message: String,
    log_target: Option<String>,
}

impl tracing::field::Visit for MessageAndTarget {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "log.target" => self.log_target = Some(value.to_string()),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DroppedReplies {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR {
            return true;
        }
        let mut seen = MessageAndTarget::default();
        event.record(&mut seen);
        let target = seen.log_target.as_deref().unwrap_or(meta.target());
        if !is_dropped_reply(*meta.level(), target, &seen.message) {
            return true;
        }
        tracing::debug!(
            target: "fuser::reply",
            "{} (the kernel dropped the request: its caller was interrupted)",
            seen.message
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tracing_subscriber::layer::SubscriberExt;

    /// Counts the ERROR events that reach it.
    struct Errors(Arc<AtomicUsize>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if *e.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn only_a_reply_the_kernel_dropped_is_demoted() {
        let errors = Arc::new(AtomicUsize::new(0));
        let count = |f: &dyn Fn()| {
            let before = errors.load(Ordering::SeqCst);
            tracing::subscriber::with_default(
                tracing_subscriber::registry()
                    .with(Errors(errors.clone()))
                    .with(DroppedReplies),
                f,
            );
            errors.load(Ordering::SeqCst) - before
        };
        let gone = "Failed to send FUSE reply: No such file or directory (os error 2)";
        // As the `log` bridge delivers fuser's record, and as a tracing event.
        assert_eq!(
            count(
                &|| tracing::event!(target: "log", tracing::Level::ERROR, log.target = "fuser::reply", "{gone}")
            ),
            0,
            "the ENOENT reply failure (through the log bridge) was not demoted"
        );
        assert_eq!(
            count(&|| tracing::error!(target: "fuser::reply", "{gone}")),
            0,
            "the ENOENT reply failure was not demoted"
        );
        // Real errors stay.
        let badf = "Failed to send FUSE reply: Bad file descriptor (os error 9)";
        assert_eq!(
            count(
                &|| tracing::event!(target: "log", tracing::Level::ERROR, log.target = "fuser::reply", "{badf}")
            ),
            1,
            "another reply failure was hidden"
        );
        assert_eq!(
            count(
                &|| tracing::event!(target: "log", tracing::Level::ERROR, log.target = "fuser::session", "{gone}")
            ),
            1,
            "the same text from another target was hidden"
        );
        assert_eq!(
            count(&|| tracing::error!(target: "kaiso_store", "{gone}")),
            1,
            "kaiso's own error was hidden"
        );
    }

    #[test]
    fn the_reply_check_wants_level_target_and_errno() {
        let gone = "Failed to send FUSE reply: No such file or directory (os error 2)";
        assert!(is_dropped_reply(
            tracing::Level::ERROR,
            "fuser::reply",
            gone
        ));
        assert!(!is_dropped_reply(
            tracing::Level::WARN,
            "fuser::reply",
            gone
        ));
        assert!(!is_dropped_reply(tracing::Level::ERROR, "fuser", gone));
        assert!(!is_dropped_reply(
            tracing::Level::ERROR,
            "fuser::reply",
            "Failed to send FUSE reply: Invalid argument (os error 22)"
        ));
        assert!(!is_dropped_reply(
            tracing::Level::ERROR,
            "fuser::reply",
            "No such file or directory (os error 2)"
        ));
    }
}
