-- Lease recovery no longer counts an attempt (the processor that held the
-- message may never have published it); it counts recoveries instead, and
-- dead-letters a message once they reach the processor's MaxRecoveries (a
-- message that makes its processors crash). A constant default: no table
-- rewrite.
ALTER TABLE {{schema}}.{{prefix}}messages
    ADD COLUMN recoveries integer NOT NULL DEFAULT 0;
