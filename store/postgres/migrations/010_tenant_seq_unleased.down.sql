CREATE INDEX {{prefix}}messages_tenant_seq ON {{schema}}.{{prefix}}messages (tenant, seq);
DROP INDEX {{schema}}.{{prefix}}messages_tenant_seq_unleased;
