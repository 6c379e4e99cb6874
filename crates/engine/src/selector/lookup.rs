//! What a selector's identifiers mean for a stored message.

use super::value::Value;
use crate::message::Message;

/// Looks up a selector identifier in `m`.
///
/// The JMS fields ActiveMQ exposes to STOMP selectors come from the message:
///
/// | identifier         | value                                                       |
/// |--------------------|-------------------------------------------------------------|
/// | `JMSPriority`      | the priority, 0–9 (long)                                    |
/// | `JMSTimestamp`     | when the broker accepted it, ms since the epoch (long)      |
/// | `JMSExpiration`    | when it expires, ms since the epoch, 0 = never (long)       |
/// | `JMSDeliveryMode`  | `'PERSISTENT'` or `'NON_PERSISTENT'`                        |
/// | `JMSMessageID`     | the `message-id`                                            |
/// | `JMSDestination`   | the destination as its header shows it (`/queue/orders`)    |
/// | `JMSType`          | the `type` header                                           |
/// | `JMSCorrelationID` | the `correlation-id` header                                 |
/// | `JMSReplyTo`       | the `reply-to` header                                       |
///
/// Any other identifier is the producer header of that name (the first, if repeated), as a
/// string; strings that are numbers or booleans are converted where the selector needs one
/// (see the module documentation). A header that is absent is NULL.
pub fn message_lookup(m: &Message) -> impl Fn(&str) -> Option<Value> + '_ {
    move |name| {
        let header = |h: &str| m.headers.get(h).map(|v| Value::Str(v.to_string()));
        match name {
            "JMSPriority" => Some(Value::Long(m.priority.into())),
            "JMSTimestamp" => i64::try_from(m.timestamp_ms).ok().map(Value::Long),
            "JMSExpiration" => i64::try_from(m.expires_ms).ok().map(Value::Long),
            "JMSDeliveryMode" => Some(Value::Str(
                if m.persistent {
                    "PERSISTENT"
                } else {
                    "NON_PERSISTENT"
                }
                .to_string(),
            )),
            "JMSMessageID" => Some(Value::Str(m.id.clone())),
            "JMSDestination" => Some(Value::Str(m.destination.to_string())),
            "JMSType" => header("type"),
            "JMSCorrelationID" => header("correlation-id"),
            "JMSReplyTo" => header("reply-to"),
            other => header(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Selector;
    use crate::types::Destination;
    use bytes::Bytes;
    use haven_headers::Headers;

    fn message() -> Message {
        Message {
            seq: 1,
            id: "ID:haven-1".into(),
            destination: Destination::Queue("orders".into()),
            headers: Headers::from_pairs(&[
                ("type", "order"),
                ("correlation-id", "c-7"),
                ("reply-to", "/queue/replies"),
                ("amount", "12.5"),
                ("count", "3"),
                ("region", "EU"),
                ("region", "US"),
                ("urgent", "true"),
            ]),
            body: Bytes::new(),
            persistent: true,
            priority: 7,
            expires_ms: 0,
            timestamp_ms: 1_700_000_000_000,
            dead_lettered: false,
        }
    }

    fn selects(text: &str) -> bool {
        let m = message();
        let lookup = message_lookup(&m);
        Selector::parse(text).unwrap().matches(&lookup)
    }

    #[test]
    fn jms_fields_map_to_the_message() {
        assert!(selects("JMSPriority = 7"));
        assert!(selects("JMSPriority > 4"));
        assert!(selects("JMSTimestamp = 1700000000000"));
        assert!(selects("JMSExpiration = 0"));
        assert!(selects("JMSDeliveryMode = 'PERSISTENT'"));
        assert!(selects("JMSMessageID = 'ID:haven-1'"));
        assert!(selects("JMSDestination = '/queue/orders'"));
        assert!(selects("JMSType = 'order'"));
        assert!(selects("JMSCorrelationID = 'c-7'"));
        assert!(selects("JMSReplyTo = '/queue/replies'"));
    }

    #[test]
    fn user_headers_are_strings_converted_where_a_number_or_boolean_is_needed() {
        assert!(selects("amount > 10"));
        assert!(selects("amount * 2 = 25"));
        assert!(selects("count BETWEEN 1 AND 5"));
        assert!(selects("count IN (1, 3)"));
        assert!(selects("count = '3'"));
        assert!(selects("urgent"));
        assert!(selects("urgent = TRUE"));
        assert!(!selects("region > 1"), "not a number: UNKNOWN");
        assert!(!selects("NOT (region > 1)"), "not a number: UNKNOWN");
    }

    #[test]
    fn the_first_of_repeated_headers_counts_and_absent_headers_are_null() {
        assert!(selects("region = 'EU'"));
        assert!(selects("missing IS NULL"));
        assert!(selects("JMSXGroupID IS NULL"));
        assert!(!selects("missing = 'x' OR NOT missing = 'x'"));
    }

    #[test]
    fn a_non_persistent_message_says_so() {
        let mut m = message();
        m.persistent = false;
        let s = Selector::parse("JMSDeliveryMode = 'NON_PERSISTENT'").unwrap();
        assert!(s.matches(&message_lookup(&m)));
    }
}
