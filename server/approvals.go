package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/approve"
	"github.com/timebox-run/timebox/store"
)

// ApprovalSignaler is an EngineRunner whose turns wait for decisions
// where the store cannot wake them (package temporal's workflows): the
// server tells it of each decision it stored.
type ApprovalSignaler interface {
	SignalApproval(ctx context.Context, turnID, callID string) error
}

// approver returns the Approver of the server's turns: decisions are
// made through the store (internal/approve).
func (s *Server) approver() agent.Approver { return approve.New(s.cfg.Store) }

// DecisionRequest is the body of POST /v1/turns/{id}/approvals/{call_id}.
type DecisionRequest struct {
	// Decision is "approve" or "deny".
	Decision event.Decision `json:"decision"`
	// Reason is told to the model with a denial, and kept in the record.
	Reason string `json:"reason,omitempty"`
	// By names who decides; empty is "a client of the server".
	By string `json:"by,omitempty"`
}

// ApprovalList is the response of GET /v1/turns/{id}/approvals.
type ApprovalList struct {
	// Approvals are the turn's calls that waited for a decision, pending
	// ones without one.
	Approvals []store.Approval `json:"approvals"`
}

// maxReason bounds a decision's reason and by.
const maxReason = 4096

// decisionRequestKeys are the keys of a DecisionRequest body.
var decisionRequestKeys = []string{"decision", "reason", "by"}

// readDecision reads the body of POST /v1/turns/{id}/approvals/{call_id}
// by the rule of every body (readBody), and checks its values.
func (s *Server) readDecision(w http.ResponseWriter, r *http.Request) (DecisionRequest, bool) {
	var req DecisionRequest
	fields, ok := s.readBody(w, r, &req, decisionRequestKeys, `{"decision": "approve" or "deny", "reason": "...", "by": "..."}`)
	if !ok {
		return req, false
	}
	switch {
	case req.Decision != event.Approve && req.Decision != event.Deny:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"decision" is %q: it must be "approve" or "deny"`, shown(string(req.Decision))))
	case len(req.Reason) > maxReason || len(req.By) > maxReason:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"reason" and "by" are at most %d bytes`, maxReason))
	case !validText(fields["reason"], req.Reason) || !validText(fields["by"], req.By):
		writeError(w, http.StatusBadRequest, "bad_request", `"reason" or "by" is not valid UTF-8 (an invalid byte, or a \u escape of half a surrogate pair)`)
	default:
		return req, true
	}
	return req, false
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	st, ok := s.cfg.Store.(store.Approvals)
	if !ok {
		writeJSON(w, http.StatusOK, ApprovalList{Approvals: []store.Approval{}})
		return
	}
	id := r.PathValue("id")
	if _, err := s.cfg.Store.Turn(r.Context(), id); err != nil {
		s.storeFailed(w, r, err, "turn "+shown(id))
		return
	}
	list, err := st.Approvals(r.Context(), id)
	if err != nil {
		s.storeFailed(w, r, err, "the approvals of turn "+shown(id))
		return
	}
	if list == nil {
		list = []store.Approval{}
	}
	writeJSON(w, http.StatusOK, ApprovalList{Approvals: list})
}

// decide is POST /v1/turns/{id}/approvals/{call_id}: the decision is
// stored — the first one wins, on any gateway — and the waiting call
// takes it from there. 200 when the call waits in this server (it goes
// on at once), 202 when it waits elsewhere (another gateway, an engine's
// worker), 404 for a call that never waited, 409 once decided or
// expired.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	id, callID := r.PathValue("id"), r.PathValue("call_id")
	req, ok := s.readDecision(w, r)
	if !ok {
		return
	}
	if req.By == "" {
		req.By = "a client of the server"
	}
	st, ok := s.cfg.Store.(store.Approvals)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("call %s of turn %s does not wait for a decision: this server's store keeps none", shown(callID), shown(id)))
		return
	}
	rec, err := s.cfg.Store.Turn(r.Context(), id)
	if err != nil {
		s.storeFailed(w, r, err, "turn "+shown(id))
		return
	}
	// Whether the decision reaches a turn of this server is known before
	// it is stored: once stored, the waiting call may take it, run, and
	// its turn end before this handler looks again.
	// A turn an engine's workers run is not here, though this server
	// follows it: the decision reaches its workflow by signal (202).
	here := s.live(id) != nil && engineOf(s.cfg.Agent) == ""
	var ap store.Approval
	if rec.Status == budget.StatusRunning {
		ap, err = st.Decide(r.Context(), id, callID, store.Approval{Decision: req.Decision, By: req.By, Reason: req.Reason, DecidedAt: time.Now()})
	} else if ap, err = st.Approval(r.Context(), id, callID); err == nil {
		// Its calls were recorded when it ended: a decision now would be
		// acted on by nobody.
		if ap.Decision == "" {
			writeError(w, http.StatusConflict, "already_ended", fmt.Sprintf("turn %s already ended: %s (%s); call %s was not run", shown(id), rec.Status, rec.StopReason, shown(callID)))
			return
		}
		err = store.ErrDecided
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("call %s of turn %s never waited for a decision", shown(callID), shown(id)))
		return
	case errors.Is(err, store.ErrDecided) && ap.Decision == event.Expired:
		writeError(w, http.StatusConflict, "expired", fmt.Sprintf("call %s of turn %s expired at %s without a decision; it was not run", shown(callID), shown(id), ap.ExpiresAt.Format(time.RFC3339)))
		return
	case errors.Is(err, store.ErrDecided):
		writeError(w, http.StatusConflict, "already_decided", fmt.Sprintf("call %s of turn %s was already decided: %s by %s", shown(callID), shown(id), ap.Decision, ap.By))
		return
	case err != nil:
		s.failed(w, r, http.StatusInternalServerError, "store_error", "storing the decision failed", err)
		return
	}
	status := http.StatusAccepted
	if here {
		status = http.StatusOK
	} else if err := s.resume(r.Context(), id); err == nil {
		// Suspended when its server stopped: it goes on here, and takes
		// the decision at once.
		status = http.StatusOK
	}
	if sg, ok := s.cfg.Agent.(ApprovalSignaler); ok {
		if err := sg.SignalApproval(r.Context(), id, callID); err != nil {
			// Stored: the workflow reads it at its expiry at the latest.
			s.log.Warn("signalling a decision to the engine failed", "turn_id", id, "call_id", callID, "err", err)
		}
	}
	writeJSON(w, status, ap)
}
