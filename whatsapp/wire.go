package whatsapp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Notification is a webhook POST body.
type Notification struct {
	Object string  `json:"object"`
	Entry  []Entry `json:"entry"`
}

// Entry is one WhatsApp Business Account's part of a Notification.
type Entry struct {
	ID      string   `json:"id"`
	Changes []Change `json:"changes"`
}

// Change is one change of an Entry; Field "messages" carries statuses and
// inbound messages.
type Change struct {
	Field string `json:"field"`
	Value Value  `json:"value"`
}

// Value is the content of a Change.
type Value struct {
	MessagingProduct string `json:"messaging_product"`
	Metadata         struct {
		DisplayPhoneNumber string `json:"display_phone_number"`
		PhoneNumberID      string `json:"phone_number_id"`
	} `json:"metadata"`
	Contacts []Contact      `json:"contacts"`
	Messages []InboundWire  `json:"messages"`
	Statuses []StatusUpdate `json:"statuses"`
	Errors   []APIError     `json:"errors"`
}

// Contact is a sender's profile in an inbound notification.
type Contact struct {
	Profile struct {
		Name string `json:"name"`
	} `json:"profile"`
	WaID   string `json:"wa_id"`
	UserID string `json:"user_id"`
}

// Timestamp is a webhook time: Unix seconds, sent as a string (a number is
// accepted too).
type Timestamp int64

// UnmarshalJSON accepts "1739321024" and 1739321024; anything else is 0.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		*t = 0
		return nil
	}
	*t = Timestamp(n)
	return nil
}

// Time returns t as a time, or the zero time for 0.
func (t Timestamp) Time() time.Time {
	if t <= 0 {
		return time.Time{}
	}
	return time.Unix(int64(t), 0).UTC()
}

// StatusUpdate is one delivery status of a sent message.
type StatusUpdate struct {
	// ID is the wamid the send returned.
	ID string `json:"id"`
	// Status is sent, delivered, read, failed or played.
	Status                string     `json:"status"`
	Timestamp             Timestamp  `json:"timestamp"`
	RecipientID           string     `json:"recipient_id"`
	BizOpaqueCallbackData string     `json:"biz_opaque_callback_data,omitempty"`
	Errors                []APIError `json:"errors,omitempty"`
	Conversation          *struct {
		ID     string `json:"id"`
		Origin struct {
			Type string `json:"type"`
		} `json:"origin"`
		ExpirationTimestamp Timestamp `json:"expiration_timestamp,omitempty"`
	} `json:"conversation,omitempty"`
	Pricing *struct {
		Billable     bool   `json:"billable"`
		PricingModel string `json:"pricing_model"`
		Type         string `json:"type"`
		Category     string `json:"category"`
	} `json:"pricing,omitempty"`
}

// InboundWire is an inbound message as Meta sends it.
type InboundWire struct {
	From      string    `json:"from"`
	UserID    string    `json:"user_id,omitempty"`
	ID        string    `json:"id"`
	Timestamp Timestamp `json:"timestamp"`
	Type      string    `json:"type"`
	Text      *struct {
		Body string `json:"body"`
	} `json:"text,omitempty"`
	// Raw is the message object as received (media, location, interactive
	// replies... are there).
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes the known fields and keeps the raw object.
func (m *InboundWire) UnmarshalJSON(b []byte) error {
	type plain InboundWire
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*m = InboundWire(p)
	m.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// ParseNotification decodes a webhook body. It returns an error for
// anything that is not a JSON object of the notification's shape.
func ParseNotification(body []byte) (*Notification, error) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return nil, errors.New("whatsapp: webhook body is not a JSON object")
	}
	var n Notification
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("whatsapp: webhook body: %w", err)
	}
	return &n, nil
}
