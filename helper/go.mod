module corral.local/exechelper

go 1.19
