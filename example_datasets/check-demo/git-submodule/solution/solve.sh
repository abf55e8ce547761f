#!/bin/bash
sed -i 's/#000000/#ffffff/' /srv/site/vendor/theme/style.css
