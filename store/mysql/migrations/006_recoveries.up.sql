-- Lease recovery no longer counts an attempt (the processor that held the
-- message may never have published it); it counts recoveries instead, and
-- dead-letters a message once they reach the processor's MaxRecoveries (a
-- message that makes its processors crash).
ALTER TABLE {{prefix}}messages
    ADD COLUMN recoveries INT NOT NULL DEFAULT 0;
-- One statement (atomic DDL): MySQL 8 has no ADD COLUMN IF NOT EXISTS.
