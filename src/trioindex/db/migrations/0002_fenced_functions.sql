-- Version 2 added the fenced server-side functions. Every function now lives in functions.sql
-- (applied by `migrate` whenever its text changes); this version changes no table.
SELECT 1;
