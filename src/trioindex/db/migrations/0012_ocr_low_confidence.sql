-- The pages OCR read with a confidence under indexing.parsing.ocr-low-confidence, in order,
-- when a version's text came from OCR and any page did (NULL otherwise): the version is indexed
-- and searchable, and marked for a person to check. Set with the version's chunk set.
ALTER TABLE document_versions ADD COLUMN ocr_low_confidence_pages integer[];
