package whatsapp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTextLength is the longest free-form text body Meta accepts, in
// characters.
const MaxTextLength = 4096

// ErrInvalidPayload is wrapped by the errors of BuildRequest.
var ErrInvalidPayload = errors.New("whatsapp: invalid message payload")

// Request is a Cloud API send request built from an outbox message payload.
type Request struct {
	// To is the normalised recipient ("+" and digits).
	To string
	// Template is true for a template message (allowed outside the
	// customer-service window).
	Template bool
	// Body is the JSON sent to the Cloud API.
	Body json.RawMessage
}

func invalidPayload(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidPayload, fmt.Sprintf(format, args...))
}

// BuildRequest turns an outbox message payload into a Cloud API request.
// It accepts the seed systems' shape:
//
//	{"to": "+33612345678", "templateCode": "order_confirmation",
//	 "payloadJson": {"language": "en", "components": [...]}}
//	{"to": "+33612345678", "body": "free-form text"}
//
// (payloadJson may also be a JSON string holding that object, and may carry
// "body" for free-form text), and the native Cloud API shape, sent as is
// apart from "to", "messaging_product" and a default "recipient_type":
//
//	{"to": "...", "type": "template", "template": {"name": "...", "language": {"code": "en_US"}, "components": [...]}}
//	{"to": "...", "type": "text", "text": {"body": "...", "preview_url": false}}
//	{"to": "...", "type": "image", "image": {"link": "https://..."}}
//
// "type" may be left out when "template" or "text" is present, "language"
// may be a plain code string and "text" a plain string. defaultLanguage is
// used for a seed template without a language. callbackData, when not
// empty, is sent as biz_opaque_callback_data unless the payload sets it
// (Meta echoes it in status webhooks).
func BuildRequest(payload []byte, defaultLanguage, callbackData string) (Request, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return Request{}, invalidPayload("not a JSON object")
	}
	var to string
	if err := json.Unmarshal(raw["to"], &to); err != nil || to == "" {
		return Request{}, invalidPayload(`"to" is required (a phone number string)`)
	}
	phone, err := NormalizePhone(to)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %q is not a phone number with a country code", ErrInvalidPhone, to)
	}

	out := map[string]any{}
	isTemplate := false
	switch {
	case raw["templateCode"] != nil:
		tpl, err := seedTemplate(raw, defaultLanguage)
		if err != nil {
			return Request{}, err
		}
		out["type"], out["template"] = "template", tpl
		isTemplate = true
	default:
		var typ string
		if raw["type"] != nil {
			if err := json.Unmarshal(raw["type"], &typ); err != nil || typ == "" {
				return Request{}, invalidPayload(`"type" must be a non-empty string`)
			}
		}
		if typ == "" {
			switch {
			case raw["template"] != nil:
				typ = "template"
			case raw["text"] != nil:
				typ = "text"
			case raw["body"] != nil:
				typ = "text"
			case raw["payloadJson"] != nil:
				typ = "text"
			default:
				return Request{}, invalidPayload(`no message content: expected "templateCode", "template", "text", "body" or "type"`)
			}
		}
		for k, v := range raw {
			switch k {
			case "to", "messaging_product", "body", "payloadJson", "templateCode":
				continue
			}
			out[k] = v
		}
		out["type"] = typ
		switch typ {
		case "template":
			tpl, err := nativeTemplate(raw["template"])
			if err != nil {
				return Request{}, err
			}
			out["template"] = tpl
			isTemplate = true
		case "text":
			txt, err := textObject(raw)
			if err != nil {
				return Request{}, err
			}
			out["text"] = txt
		default:
			if obj := raw[typ]; len(obj) == 0 || obj[0] != '{' {
				return Request{}, invalidPayload("type %q needs an object %q", typ, typ)
			}
		}
	}
	out["messaging_product"] = "whatsapp"
	out["to"] = phone
	if _, ok := out["recipient_type"]; !ok {
		out["recipient_type"] = "individual"
	}
	if _, ok := out["biz_opaque_callback_data"]; !ok && callbackData != "" {
		out["biz_opaque_callback_data"] = callbackData
	}
	body, err := json.Marshal(out)
	if err != nil {
		return Request{}, invalidPayload("%v", err)
	}
	return Request{To: phone, Template: isTemplate, Body: body}, nil
}

// seedPayload is the seed's payloadJson object.
type seedPayload struct {
	Language   json.RawMessage `json:"language"`
	Components json.RawMessage `json:"components"`
	Body       string          `json:"body"`
	Text       string          `json:"text"`
}

func decodeSeedPayload(v json.RawMessage) (seedPayload, error) {
	var p seedPayload
	if len(v) == 0 || string(v) == "null" {
		return p, nil
	}
	if v[0] == '"' { // stored as a JSON string holding the object
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return p, invalidPayload(`"payloadJson" is not valid`)
		}
		v = json.RawMessage(s)
	}
	if err := json.Unmarshal(v, &p); err != nil {
		return p, invalidPayload(`"payloadJson" must be an object with "language" and "components"`)
	}
	return p, nil
}

func language(v json.RawMessage, def string) (any, error) {
	if len(v) == 0 || string(v) == "null" {
		if def == "" {
			return nil, invalidPayload("template language is required")
		}
		return map[string]string{"code": def}, nil
	}
	var code string
	if json.Unmarshal(v, &code) == nil {
		if code == "" {
			return nil, invalidPayload("template language is empty")
		}
		return map[string]string{"code": code}, nil
	}
	var obj struct {
		Code string `json:"code"`
	}
	if err := json.Unmarshal(v, &obj); err != nil || obj.Code == "" {
		return nil, invalidPayload(`template language must be a code or {"code": ...}`)
	}
	return v, nil
}

func components(v json.RawMessage) (json.RawMessage, error) {
	if len(v) == 0 || string(v) == "null" {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, invalidPayload(`template "components" must be an array`)
	}
	return v, nil
}

func seedTemplate(raw map[string]json.RawMessage, defLang string) (map[string]any, error) {
	var name string
	if err := json.Unmarshal(raw["templateCode"], &name); err != nil || name == "" {
		return nil, invalidPayload(`"templateCode" must be a non-empty string`)
	}
	p, err := decodeSeedPayload(raw["payloadJson"])
	if err != nil {
		return nil, err
	}
	lang, err := language(p.Language, defLang)
	if err != nil {
		return nil, err
	}
	comps, err := components(p.Components)
	if err != nil {
		return nil, err
	}
	tpl := map[string]any{"name": name, "language": lang}
	if comps != nil {
		tpl["components"] = comps
	}
	return tpl, nil
}

func nativeTemplate(v json.RawMessage) (map[string]any, error) {
	var t map[string]json.RawMessage
	if err := json.Unmarshal(v, &t); err != nil || t == nil {
		return nil, invalidPayload(`"template" must be an object`)
	}
	var name string
	if err := json.Unmarshal(t["name"], &name); err != nil || name == "" {
		return nil, invalidPayload(`"template.name" is required`)
	}
	lang, err := language(t["language"], "")
	if err != nil {
		return nil, err
	}
	if _, err := components(t["components"]); err != nil {
		return nil, err
	}
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = v
	}
	out["language"] = lang
	return out, nil
}

func textObject(raw map[string]json.RawMessage) (any, error) {
	var body string
	var obj map[string]json.RawMessage
	switch t := raw["text"]; {
	case len(t) > 0 && t[0] == '"':
		_ = json.Unmarshal(t, &body)
	case len(t) > 0 && t[0] == '{':
		if err := json.Unmarshal(t, &obj); err != nil {
			return nil, invalidPayload(`"text" must be an object or a string`)
		}
		if err := json.Unmarshal(obj["body"], &body); err != nil {
			return nil, invalidPayload(`"text.body" must be a string`)
		}
	case len(t) > 0:
		return nil, invalidPayload(`"text" must be an object or a string`)
	case raw["body"] != nil:
		if err := json.Unmarshal(raw["body"], &body); err != nil {
			return nil, invalidPayload(`"body" must be a string`)
		}
	default:
		p, err := decodeSeedPayload(raw["payloadJson"])
		if err != nil {
			return nil, err
		}
		body = p.Body
		if body == "" {
			body = p.Text
		}
	}
	if strings.TrimSpace(body) == "" {
		return nil, invalidPayload("text body is empty")
	}
	if n := utf8.RuneCountInString(body); n > MaxTextLength {
		return nil, invalidPayload("text body is %d characters, the limit is %d", n, MaxTextLength)
	}
	if obj != nil {
		out := make(map[string]any, len(obj))
		for k, v := range obj {
			out[k] = v
		}
		return out, nil
	}
	return map[string]string{"body": body}, nil
}
