package outbox

import (
	"fmt"
	"slices"
)

// DeadLetterPolicy says what a dead letter of an ordered group (Group not
// "") does to the messages of its group behind it.
type DeadLetterPolicy string

// The dead-letter policies.
const (
	// DeadLetterContinue: the group moves on. The message after the dead
	// letter is published next; a requeued dead letter is published after
	// the messages that overtook it. The default.
	DeadLetterContinue DeadLetterPolicy = "continue"
	// DeadLetterBlock: the dead letter holds its group (tenant, topic,
	// group) as a message waiting for a retry does. Nothing behind it is
	// published until it is requeued (it is then published first: the
	// group keeps its order) or cancelled (the group moves on). Other
	// groups, topics and tenants are not affected.
	DeadLetterBlock DeadLetterPolicy = "block"
)

// Valid reports whether p is a policy ("" is not: it means "the default"
// only as a field of DeadLetterRule).
func (p DeadLetterPolicy) Valid() bool {
	return p == DeadLetterContinue || p == DeadLetterBlock
}

// DeadLetterRule chooses the DeadLetterPolicy of each topic: ByTopic's
// entry, else Default, else DeadLetterContinue. The processor applies it
// when it dead-letters a message (MessageFinish) and when lease recovery
// does (MessageRecover): a dead letter of an ordered group under
// DeadLetterBlock is stored with Message.BlocksGroup set.
//
// The policy belongs to a topic, not to a message, because order is a
// property of the stream: every message of a group must follow the same
// rule, or a group would block at one dead letter and skip the next. A
// per-tenant choice is not offered: blocking holds one (tenant, topic,
// group) only, so a blocking topic never stalls another tenant.
type DeadLetterRule struct {
	// Default is the policy of topics without an entry in ByTopic. ""
	// means DeadLetterContinue.
	Default DeadLetterPolicy
	// ByTopic overrides Default per topic.
	ByTopic map[string]DeadLetterPolicy
}

// Policy returns the policy of topic.
func (r DeadLetterRule) Policy(topic string) DeadLetterPolicy {
	if p, ok := r.ByTopic[topic]; ok && p != "" {
		return p
	}
	if r.Default != "" {
		return r.Default
	}
	return DeadLetterContinue
}

// Blocks reports whether a dead letter of topic and group holds its group:
// the group is not "" (unordered messages have no group to hold) and the
// topic's policy is DeadLetterBlock.
func (r DeadLetterRule) Blocks(topic, group string) bool {
	return group != "" && r.Policy(topic) == DeadLetterBlock
}

// BlockingTopics describes r for a store that evaluates it in a query: a
// dead letter of topic t blocks when t is in block, or when def is true
// and t is not in cont. Both lists are sorted.
func (r DeadLetterRule) BlockingTopics() (def bool, block, cont []string) {
	def = r.Default == DeadLetterBlock
	for t, p := range r.ByTopic {
		switch p {
		case DeadLetterBlock:
			block = append(block, t)
		case DeadLetterContinue:
			cont = append(cont, t)
		}
	}
	slices.Sort(block)
	slices.Sort(cont)
	return def, block, cont
}

// Validate checks that every policy of r is a known one (Default may be
// "") and that no topic is empty.
func (r DeadLetterRule) Validate(field string) error {
	if r.Default != "" && !r.Default.Valid() {
		return invalid(field+".Default", fmt.Sprintf("%q is not a dead-letter policy (%q or %q)", r.Default, DeadLetterContinue, DeadLetterBlock))
	}
	for t, p := range r.ByTopic {
		if t == "" {
			return invalid(field+".ByTopic", "has an empty topic")
		}
		if !p.Valid() {
			return invalid(field+".ByTopic", fmt.Sprintf("topic %q: %q is not a dead-letter policy (%q or %q)", t, p, DeadLetterContinue, DeadLetterBlock))
		}
	}
	return nil
}

// DeadLetterBlocker is an optional Store capability: the store records a
// dead letter's Outcome.BlockGroup (and MessageRecoverParams.DeadLetter),
// and its claim holds a group behind a blocking dead letter. NewProcessor
// refuses a Config.DeadLetter that can block on a store without it, rather
// than let its groups move on silently.
type DeadLetterBlocker interface {
	// DeadLetterBlocking reports whether the store holds groups at
	// blocking dead letters.
	DeadLetterBlocking() bool
}

// canBlock reports whether r blocks some topic.
func (r DeadLetterRule) canBlock() bool {
	if r.Default == DeadLetterBlock {
		return true
	}
	for _, p := range r.ByTopic {
		if p == DeadLetterBlock {
			return true
		}
	}
	return false
}

// checkDeadLetterStore refuses a blocking rule on a store that cannot block.
func checkDeadLetterStore(r DeadLetterRule, s Store) error {
	if !r.canBlock() {
		return nil
	}
	if b, ok := s.(DeadLetterBlocker); ok && b.DeadLetterBlocking() {
		return nil
	}
	return invalid("Config.DeadLetter", fmt.Sprintf("asks for %q, but the store (%T) cannot hold a group at a dead letter "+
		"(it does not implement outbox.DeadLetterBlocker); use %q", DeadLetterBlock, s, DeadLetterContinue))
}

// routedTopics refuses Config.Topics naming a topic the publisher says it
// does not publish (a *Router without that route): its messages would be
// claimed and dead-lettered as ErrNoPublisher. A publisher that names no
// topics is not checked.
func routedTopics(cfg Config, pub Publisher) error {
	t, ok := pub.(interface{ Topics() []string })
	if !ok || len(cfg.Topics) == 0 {
		return nil
	}
	routed := t.Topics()
	if len(routed) == 0 {
		return nil // a wrapper of a publisher that does not name its topics
	}
	for _, topic := range cfg.Topics {
		if !slices.Contains(routed, topic) {
			return invalid("Config.Topics", fmt.Sprintf("names topic %q, which the publisher has no route for (its topics: %v): "+
				"its messages would be dead-lettered", topic, routed))
		}
	}
	return nil
}
