-- Client certificates as principals: kl serve --client-ca makes a verified client certificate's
-- subject common name the principal 'cert:CN=NAME', which grants name like users and tokens.
-- Such a principal has exactly its grants (none: every request refused).

ALTER TABLE access_grants DROP CONSTRAINT access_grants_principal_check;
ALTER TABLE access_grants ADD CONSTRAINT access_grants_principal_check
    CHECK (principal ~ '^(user|token):.' OR principal ~ '^cert:CN=.');
