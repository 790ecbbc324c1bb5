// Package events is the gateway's decision event producer: it turns each
// decision into a DecisionEvent record on Kafka's decisions topic.
package events
